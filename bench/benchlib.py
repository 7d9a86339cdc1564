"""What the benchmark scripts share (they run under different venvs; each imports this
file from its own folder)."""
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


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


def cpu_seconds(pid):
    """User + system CPU seconds process `pid` (all its threads) has used so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_http(url, what, timeout=60):
    """Waits until `url` answers HTTP (any status), or exits naming `what`."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            urllib.request.urlopen(url, timeout=0.5).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"{what} did not come up at {url}")


def to_ms(text):
    """A wrk latency (`512.00us`, `1.20ms`, `2.00s`) in milliseconds."""
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def wrk(url, body, duration, work):
    """POSTs `body` as JSON to `url` (GETs it when `body` is None) under wrk (2 threads, 8
    connections) for `duration` seconds; exits on any error response. Returns
    (requests/s, p50 ms, p99 ms)."""
    script = os.path.join(work, "post.lua")
    with open(script, "w") as fh:
        if body is not None:
            fh.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                     f"wrk.body = '{json.dumps(body)}'\n")
    out = subprocess.run(["wrk", "-t2", "-c8", f"-d{duration}s", "--latency", "-s", script, url],
                         capture_output=True, text=True, check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        sys.exit(f"{url}: {errors.group(1)} error responses under load\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = to_ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))
    p99 = to_ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))
    return rps, p50, p99


def stop_all(procs, timeout=10):
    """Stops the started processes, newest first: SIGTERM, then SIGKILL after `timeout` s."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()


_BLACK_HOLE = []


def black_hole():
    """A loopback port that takes connections and never reads or answers them (an HTTP
    endpoint that never answers); it lives as long as this process."""
    import threading
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(128)

    def accept():
        while True:
            conn, _ = server.accept()
            _BLACK_HOLE.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    return server.getsockname()[1]


def lineage_section(mode, interval="60s"):
    """quiver.yaml's `lineage:` for a benchmark (docs/lineage.md): `off`, `file`, or
    `http-stalled` (the http transport to an endpoint that never answers)."""
    if mode == "off":
        return ""
    if mode == "file":
        return f"lineage:\n  transport: file\n  interval: {interval}\n"
    return f"lineage:\n  transport: http\n  url: http://127.0.0.1:{black_hole()}/api/v1/lineage\n  interval: {interval}\n"
