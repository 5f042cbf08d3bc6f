"""An emulated Kubernetes cluster on one machine, for the tests and for a platform team trying gpuyard
before a cluster (docs/kubernetes.md, "The emulated cluster").

kmock's emulator is the API server (`apiserver.py`, with what a real one stamps on every write); a
binder places pods as kube-scheduler would (`scheduling.py`, the rule; `binder.py`, the loop). It
knows Kubernetes only: nothing here imports gpuyard.
"""
