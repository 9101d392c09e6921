"""Hosts for the studies: n network namespaces of netns_hosts.sh (beside this file) over links that
delay and pace like a wire (the wire of studies/lib/wire/ where the kernel has no netem; see
netns_hosts.sh), checked by studies/lib/calibrate.py, and one worker server per host (`--serve` of
the training driver or of another driver with the same protocol, studies/train/train.py's
serve()). Used by the time, switch and tta studies."""
import json
import os
import subprocess

from studies.lib import launch

HOSTS_SH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns_hosts.sh")
N = 4
DRIVER = "studies.train.train"  # the module whose --serve the servers run


class Hosts:
    """n namespaces of netns_hosts.sh, driven through bash (the switch study makes one set per host
    count: `tag` apart). link: HOSTS_LINK (auto, wire, netem, tbf-legacy; default: the
    environment's, else auto). After shape()/delay(), calibrate() checks the links (and raises
    calibrate.CalibrationError if they fail); its dict is kept in `calibration` for the run's JSON.
    Not thread-safe."""

    def __init__(self, n=N, tag=None, link=None):
        self.n = n
        self.env = dict(os.environ, HOSTS_TAG=tag or f"lrt{os.getpid()}", HOSTS_N=str(n))
        if link:
            self.env["HOSTS_LINK"] = link
        self.up = False
        self.calibration = None

    def _sh(self, call):
        r = subprocess.run(["bash", "-c", f'. "{HOSTS_SH}" && {call}'], env=self.env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"netns_hosts.sh: {call} failed (exit {r.returncode}): {r.stderr.strip()}")
        return r.stdout.strip()

    def make(self):
        self.up = True
        self._sh(f"hosts_up {self.n}")

    def shape(self, rate):
        """Every link at `rate` ("100mbit", "1gbit"); returns bit/s."""
        self.calibration = None
        return int(self._sh(f"hosts_shape {rate}"))

    def delay(self, delay):
        """One-way delay ("250us", "1ms", "0") on every link, the rate kept."""
        self.calibration = None
        self._sh(f"hosts_delay {delay}")

    def loss(self, p):
        """Every link loses each frame with probability p (0 <= p < 1), as netns_hosts.sh's
        hosts_loss (on the wire: from a seeded generator, HOSTS_LOSS_SEED)."""
        self._sh(f"hosts_loss {p}")

    def cut(self, i):
        """Host i's link cut: nothing in or out until heal(i)."""
        self._sh(f"hosts_cut {int(i)}")

    def heal(self, i=-1):
        """Host i's link mended (-1: every host's)."""
        self._sh(f"hosts_heal {int(i)}")

    def settings(self):
        """(kind of link, rate in bit/s (0: none), one-way delay in s) as set now."""
        kind, bits, ns = self._sh("hosts_settings").split()
        return kind, int(bits), int(ns) / 1e9

    def link_stats(self):
        """The wire's counters since the previous call (its status line); "" for other links."""
        return self._sh("hosts_link_stats")

    def calibrate(self, out_dir=None, **kw):
        """calibrate.checked(self): the calibration dict (kept in self.calibration), also appended
        as one line to out_dir/calibrations.jsonl when out_dir is given (beside the runs it covers,
        passed or not; .jsonl, so the reports' globs of run files *.json do not take it); raises
        calibrate.CalibrationError if it failed."""
        from studies.lib import calibrate
        cal = calibrate.with_retries(self, **kw)
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, "calibrations.jsonl"), "a") as f:
                f.write(json.dumps(cal) + "\n")
        self.calibration = calibrate.require(cal)
        return cal

    def down(self):
        if self.up:
            subprocess.run(["bash", "-c", f'. "{HOSTS_SH}" && hosts_down'], env=self.env)
            self.up = False

    def prefix(self, i):
        return ["ip", "netns", "exec", f"{self.env['HOSTS_TAG']}h{i}"]


class Servers:
    """One `python -m DRIVER --serve` per host (and one set for loopback), started on first use.
    driver: another module with train.py's --serve (studies.switch.driver); pin: worker i on core i
    (taskset), for as many hosts as cores."""

    def __init__(self, python, hosts, driver=DRIVER, pin=False):
        self.python, self.hosts, self.sets = python, hosts, {}
        self.n, self.driver, self.pin = hosts.n, driver, pin

    def get(self, setting):
        net = "loopback" if setting == "loopback" else "hosts"
        if net not in self.sets:
            ifname = "lo" if net == "loopback" else "eth0"
            env = launch.env(GLOO_SOCKET_IFNAME=ifname, LOWRANK_SOCKET_IFNAME=ifname,
                       UCX_TLS="tcp,self", UCX_NET_DEVICES=ifname, OMP_NUM_THREADS="1")
            self.sets[net] = [subprocess.Popen(
                (self.hosts.prefix(i) if net == "hosts" else [])
                + (["taskset", "-c", str(i)] if self.pin else [])
                + ["nice", "-n", "-20"] + launch.module(self.python, self.driver, "--serve"),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
                for i in range(self.n)]
        return self.sets[net], ("127.0.0.1" if net == "loopback" else "10.77.0.1")

    def run(self, setting, argv, log, port):
        procs, addr = self.get(setting)
        for i, p in enumerate(procs):
            env = dict(RANK=str(i), WORLD_SIZE=str(self.n), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                       MASTER_ADDR=addr, MASTER_PORT=str(port))
            p.stdin.write(json.dumps(dict(argv=argv, env=env, log=log if i == 0 else None)) + "\n")
            p.stdin.flush()
        rcs = []
        for p in procs:
            line = p.stdout.readline()
            if not line:
                raise SystemExit(f"hosts.py: a worker server ended (exit {p.wait()})")
            rcs.append(json.loads(line)["rc"])
        return rcs

    def train(self, setting, argv, out, port):
        """One training run on the hosts (argv: the driver's, writing the JSON `out`, its log beside
        it): (the run's JSON, "") when every worker exited 0 and `out` exists, else (None, a note
        naming the exit statuses and the log), with any partial `out` removed so a resume redoes it."""
        rcs = self.run(setting, argv, out[:-5] + ".log", port)
        if all(rc == 0 for rc in rcs) and os.path.exists(out):
            with open(out) as f:
                return json.load(f), ""
        if os.path.exists(out):
            os.remove(out)
        return None, f"FAILED (exit statuses {rcs}; see {out[:-5]}.log)"

    def close(self):
        for procs in self.sets.values():
            for p in procs:
                p.stdin.close()
            for p in procs:
                p.wait()


def add_run_args(ap, plan, results):
    """The arguments every study on these hosts takes (switch, tta): the workers' Python, the
    results folder, the quiet-machine guard, the budget, the process group's timeout, --dry-run;
    defaults from the study's plan (max_busy, budget_min, timeout_s)."""
    import sys
    ap.add_argument("--python", default=sys.executable, help="the Python with torch for the workers")
    ap.add_argument("--results", default=results)
    ap.add_argument("--max-busy", type=float, default=plan["max_busy"],
                    help="the machine's busy CPU share over 5 s above which a run waits")
    ap.add_argument("--budget-min", type=float, default=plan["budget_min"])
    ap.add_argument("--timeout", type=float, default=plan["timeout_s"], help="the process group's timeout (s)")
    ap.add_argument("--dry-run", action="store_true")


def may_start(name, args, t0):
    """Whether the next run may start (args from add_run_args; t0: the study's time.monotonic() at
    its start): not past --budget-min, and a quiet machine (procstat.wait_quiet waits for one up to
    the budget's end). Says on stderr why not."""
    import sys
    import time
    from studies.lib import procstat
    end = t0 + 60 * args.budget_min
    if time.monotonic() > end:
        print(name + ": --budget-min reached; rerun to resume", file=sys.stderr)
        return False
    if not procstat.wait_quiet(args.max_busy, end):
        print(name + ": --budget-min reached while waiting for a quiet machine; rerun to resume",
              file=sys.stderr)
        return False
    return True
