"""A small worker that behaves like the training runtime towards the control plane.

It resumes from the step in its checkpoint file, heartbeats with its step and newest checkpoint,
and on SIGTERM (or a `checkpoint_and_stop` answer) saves a checkpoint and exits 75 (preempted).
Usage: checkpointing_worker.py TOTAL_STEPS STEP_SECONDS
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx

total, step_s = int(sys.argv[1]), float(sys.argv[2])
# Like the training runtime: <root>/step-N/ per checkpoint, and the heartbeat reports that directory.
root = Path(os.environ["GPUYARD_CHECKPOINT_URL"].removeprefix("file://"))
saved = sorted(root.glob("step-*/state.json"), key=lambda p: int(p.parent.name.removeprefix("step-")))
step = json.loads(saved[-1].read_text())["step"] if saved else 0
print(f"attempt {os.environ['GPUYARD_ATTEMPT_ID']} resumed from step {step}", flush=True)
stop = False


def on_term(signum: int, frame: object) -> None:
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)


def save() -> dict[str, object]:
    directory = root / f"step-{step}"
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f"state.{os.environ['RANK']}.tmp"  # ranks save side by side
    partial.write_text(json.dumps({"step": step}))
    os.replace(partial, directory / "state.json")
    return {"url": directory.as_uri(), "step": step, "cost_s": 0.01}


def beat(saved: dict[str, object] | None) -> str:
    url = f"{os.environ['GPUYARD_API_URL']}/v1/attempts/{os.environ['GPUYARD_ATTEMPT_ID']}/heartbeat"
    body = {"fencing_token": int(os.environ["GPUYARD_FENCING_TOKEN"]), "step": step, "checkpoint": saved}
    secret = {"Authorization": f"Bearer {os.environ['GPUYARD_ATTEMPT_SECRET']}"}
    response = httpx.post(url, json=body, headers=secret, timeout=10)
    if response.status_code in (401, 409):  # the attempt has ended, or a stale token
        print("attempt refused: stopping without writing", flush=True)
        sys.exit(76)
    return str(response.json()["action"])


while step < total:
    time.sleep(step_s)
    step += 1
    saved = save() if step % 5 == 0 else None
    if beat(saved) == "checkpoint_and_stop" or stop:
        beat(save())
        print(f"preempted at step {step}, checkpoint saved", flush=True)
        sys.exit(75)
print(f"finished at step {step}", flush=True)
