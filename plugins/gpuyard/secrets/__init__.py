"""Per-team secret stores: values that jobs name in `env_from_secret` and never see in any response.

`files` keeps them under the control plane's home (embedded profile); in production they are
Kubernetes Secrets named by `launchers.kubernetes.manifests.team_secret_name`, which the kubelet
reads straight into the worker pods.
"""
