"""Starts `pcc-run -n 2` on a long benchmark, kills rank 1 with SIGKILL once
both ranks run, and checks that the job ends within a bounded time with a
non-zero status and a message naming the dead rank. Prints what it saw.

usage: kill_rank.py PCC_RUN MODEL.so INPUT.npy
"""
import os
import signal
import subprocess
import sys
import time

pcc_run, model, data = sys.argv[1:4]
marker = "--bench"
job = subprocess.Popen([pcc_run, "-n", "2", model, "--input", data,
                        marker, "100000000"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, start_new_session=True)


def ranks():
    """PIDs of the pcc-run ranks: processes whose parent is mpirun."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == job.pid and any(b"pcc-run" in c for c in cmd[:1]):
            found.append(int(pid))
    return sorted(found)


deadline = time.time() + 60
while len(ranks()) < 2 and time.time() < deadline and job.poll() is None:
    time.sleep(0.2)
pids = ranks()
if len(pids) < 2:
    job.kill()
    print("could not see 2 ranks start:", job.communicate()[0])
    sys.exit(1)
time.sleep(1.0)  # let both ranks enter the benchmark loop
os.kill(pids[-1], signal.SIGKILL)
start = time.time()
try:
    out, _ = job.communicate(timeout=60)
except subprocess.TimeoutExpired:
    os.killpg(job.pid, signal.SIGKILL)
    print("HANG: the job did not end within 60 s of killing a rank")
    sys.exit(1)
print(f"job ended {time.time() - start:.0f} s after the kill, status "
      f"{job.returncode}")
print(out)
