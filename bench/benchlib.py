"""What the benchmark scripts share (they run under different venvs; each imports this
file from its own folder)."""
import re
import socket
import subprocess
import sys
import time


def free_port():
    """A free TCP port on loopback."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, what, timeout=30):
    """Waits until something listens on the loopback port, or exits naming it."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{what} did not start on port {port}")


def time_v(cmd, cwd=None):
    """Runs cmd under /usr/bin/time -v (exits on failure); returns (wall s, cpu s, peak
    RSS bytes, stdout, stderr)."""
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr[-3000:]}")
    se = p.stderr
    parts = [float(x) for x in re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", se).group(1).split(":")]
    wall = sum(v * 60 ** (len(parts) - 1 - i) for i, v in enumerate(parts))
    cpu = float(re.search(r"User time \(seconds\): (\S+)", se).group(1)) + float(re.search(r"System time \(seconds\): (\S+)", se).group(1))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", se).group(1)) * 1024
    return wall, cpu, rss, p.stdout, se
