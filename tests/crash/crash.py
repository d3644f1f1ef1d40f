"""Crash test harness (issue 7): concurrent writers on many streams, the server
SIGKILLed at random moments, many times; after every restart each
acknowledged append must be there exactly once, in order, whole, at the offset
the server answered for it, and retries across the crash must be deduplicated.

One data directory for the whole run. Each cycle:

1. writers append concurrently for a random 0.2-1.5 s: Durable Streams byte
   and JSON streams through idempotent producers (some streams have two), and
   S2 streams through `match_seq_num`;
2. the server is SIGKILLed with appends in flight;
3. it is restarted on the same data dir, and every stream is read whole from
   its beginning and verified (verify.py);
4. the appends left in flight are retried, producer state and offsets are
   probed (recover.py); the next cycle appends to the same streams.

After the last cycle the server is stopped gracefully, started again and
verified once more. Everything random derives from --seed (the kill moments,
the stream mix, every payload); thread timing does not, so a replay repeats
the workload, not the exact interleaving.

Ends with `crash: N cycles, N acknowledged appends verified, N failed` and
exits 1 on any violation, leaving the data dir and server log for a look.
"""

import argparse
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pylib"))
sys.dont_write_bytecode = True

from runnel_harness import Server  # noqa: E402

from recover import recover  # noqa: E402
from verify import verify_all  # noqa: E402
from workload import Violations, Workload  # noqa: E402

# How long writers may take to notice the kill (their requests fail at once).
WRITER_EXIT_S = 20.0
# Violations printed in full; the count covers all of them.
SHOWN = 25


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=10, help="kill cycles (default 10)")
    ap.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    ap.add_argument("--streams", type=int, default=24,
                    help="Durable Streams streams, half bytes half JSON (default 24)")
    ap.add_argument("--s2-streams", type=int, default=3, help="S2 streams (default 3)")
    ap.add_argument("--min-run", type=float, default=0.2,
                    help="shortest write phase before the kill, seconds (default 0.2)")
    ap.add_argument("--max-run", type=float, default=1.5,
                    help="longest write phase before the kill, seconds (default 1.5)")
    ap.add_argument("--keep", action="store_true", help="keep the data dir and log even on success")
    args = ap.parse_args()
    if args.cycles < 1 or args.streams < 0 or args.s2_streams < 0 or not (
            0 < args.min_run <= args.max_run):
        ap.error("need --cycles >= 1, --streams/--s2-streams >= 0, 0 < --min-run <= --max-run")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 32)
    return args


def log_note(server, text):
    """A line in the server log, so the log shows where each kill fell."""
    with open(server.log_path, "a") as log:
        log.write(f"--- crash harness: {text}\n")


def write_until_killed(server, workload, run_for, violations):
    """Writers append for run_for seconds, then the server is SIGKILLed under them."""
    stop = threading.Event()
    threads = workload.start_writers(server.url, stop, violations)
    time.sleep(run_for)
    if server.proc.poll() is not None:
        violations.add(f"the server exited by itself (status {server.proc.returncode}) "
                       f"while being written to")
    server.kill()
    stop.set()
    deadline = time.monotonic() + WRITER_EXIT_S
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            violations.add(f"writer {t.name} still running {WRITER_EXIT_S:.0f} s after the kill")


def restart_and_verify(server, workload, rngs, violations):
    """Start on the same data dir, verify every stream, then retry and probe.
    Returns (acked appends verified, in-flight appends found committed, timings);
    0 verified if verification found a problem."""
    t0 = time.monotonic()
    try:
        server.start()
    except RuntimeError as e:
        violations.add(f"the server did not come back on its data dir: {e}")
        return 0, 0, (time.monotonic() - t0, 0.0)
    t1 = time.monotonic()
    problems, checked = verify_all(server.url, workload)
    for problem in problems:
        violations.add(problem)
    t2 = time.monotonic()
    if problems:
        return 0, 0, (t1 - t0, t2 - t1)
    committed = recover(server.url, workload, rngs, violations)
    return checked, committed, (t1 - t0, t2 - t1)


def run(args, server, violations):
    """The cycles; returns (cycles run, acknowledged appends the last clean
    verification checked)."""
    workload = Workload(args.seed, args.streams, args.s2_streams)
    kinds = [s.kind for s in workload.ds]
    print(f"crash harness: {kinds.count('bytes')} byte + {kinds.count('json')} JSON streams "
          f"({sum(len(s.producers) > 1 for s in workload.ds)} with two producers), "
          f"{len(workload.s2)} S2 streams; data in {server.data_dir}", flush=True)
    kills = random.Random(f"{args.seed}/kills")
    # Separate streams of randomness, so that kill moments do not depend on
    # how much got written (which decides how many samples the probes draw).
    rngs = {name: random.Random(f"{args.seed}/{name}") for name in ("probes", "epochs")}
    server.start()
    workload.create(server.url)
    checked = 0
    for cycle in range(1, args.cycles + 1):
        run_for = kills.uniform(args.min_run, args.max_run)
        acked_before = workload.acked_count()
        write_until_killed(server, workload, run_for, violations)
        in_flight = len(workload.in_flight())
        acked_now = workload.acked_count() - acked_before
        log_note(server, f"cycle {cycle}: SIGKILL after {run_for:.2f} s, "
                         f"{in_flight} appends in flight")
        verified, committed, (t_start, t_verify) = restart_and_verify(
            server, workload, rngs, violations)
        checked = verified or checked
        print(f"cycle {cycle:3d}/{args.cycles}: wrote {run_for:.2f} s, +{acked_now} acked, "
              f"{in_flight} in flight at the kill ({committed} had been committed); "
              f"restart {t_start:.2f} s, verify {t_verify:.2f} s: "
              f"{'ok' if not violations else 'FAILED'}", flush=True)
        if violations:
            return cycle, checked
    log_note(server, "final graceful restart")
    server.stop()
    verified, _, _ = restart_and_verify(server, workload, rngs, violations)
    checked = verified or checked
    print(f"after a graceful restart: {verified} acknowledged appends verified: "
          f"{'ok' if not violations else 'FAILED'}", flush=True)
    return args.cycles, checked


def main():
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    replay = (f"tests/crash/run --seed {args.seed} --cycles {args.cycles} "
              f"--streams {args.streams} --s2-streams {args.s2_streams}")
    print(f"crash harness: seed {args.seed} (replay: {replay})", flush=True)
    root = Path(tempfile.mkdtemp(prefix="runnel-crash-"))
    server = Server(root / "data")
    violations = Violations()
    cycles = checked = 0
    started = time.monotonic()
    try:
        cycles, checked = run(args, server, violations)
    except Exception as e:  # a broken harness run is a failure too, with its reason
        violations.add(f"harness error: {e!r}")
    except BaseException:  # Ctrl-C, SIGTERM: clean up and go
        server.kill()
        shutil.rmtree(root, ignore_errors=True)
        raise
    finally:
        server.kill()
    for problem in violations.items[:SHOWN]:
        print(f"VIOLATION: {problem}")
    if len(violations) > SHOWN:
        print(f"... and {len(violations) - SHOWN} more")
    if violations or args.keep:
        if violations:
            print(server.log_tail(30))
            print(f"replay: {replay}")
        print(f"kept {root} (data dir and server log data.log)")
    else:
        shutil.rmtree(root, ignore_errors=True)
    print(f"took {time.monotonic() - started:.1f} s")
    print(f"crash: {cycles} cycles, {checked} acknowledged appends verified, "
          f"{len(violations)} failed")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
