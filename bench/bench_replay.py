"""`monitor replay` on big files: peak memory against file size, events/s, and the same alerts as before.

1. Generate JSON-lines files of 5-minute windows from ``monitor.data.traffic.Traffic``
   (``--devices`` people, a daily swing of +-30 %, a clustered surge of 30 % for two
   windows every day at 12:00, readings to two decimals, event times uniform in each
   window), one per ``--days`` size, in time order.
2. Replay each in a fresh process (the shipped config.yaml and a model fitted on the
   bundled reference vitals, a fresh ``--ledger``, seeded noise), and report the file's
   size, the events, wall and CPU seconds, events per CPU-second and per wall second, and
   the process's peak resident set (``/proc/self/status`` VmHWM) against the size.
3. ``--compare-days D``: replay a D-day file, and the same file with its lines shuffled,
   with the replay of the parent commit (``git show <rev>:monitor/stream/replay.py``,
   imported from a temporary file; it holds the whole file in memory), and check that the
   output files (every window's alert record) are byte for byte the same as this
   version's, for the same seed. Its memory and rate are reported beside.

    OMP_NUM_THREADS=1 python bench/bench_replay.py --devices 10000 --days 0.5 1 2 3 --compare-days 0.5 --write

Single-threaded on purpose (``OMP_NUM_THREADS=1``): a replay is one core's work.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
WINDOW = 300.0
T0 = 1_763_683_200.0  # 2025-11-21T00:00:00Z, on the window grid


def generate(path: Path, devices: int, days: float, seed: int = 1) -> int:
    """A file of ``days`` of 5-minute windows from ``devices`` people; returns the event count."""
    from monitor.data.traffic import Surge, Traffic

    windows = int(round(days * 86400 / WINDOW))
    per_day = int(86400 / WINDOW)
    traffic = Traffic(people=devices, days=max(1, int(np.ceil(days))), window_seconds=WINDOW, seed=seed)
    surges = [Surge(start=d * per_day + per_day // 2, windows=2, share=0.3, kind="clustered", center=(84.0, 150.0))
              for d in range(int(np.ceil(days)))]
    rng = np.random.default_rng(seed)
    names = traffic.sim.feature_names
    template = '{"device_id": "%s", "ts": %r, ' + ", ".join(f'"{n}": %r' for n in names) + "}\n"
    n = 0
    with open(path, "w") as f:
        for i in range(windows):
            X, entities, _ = traffic.window(i, surges)
            ts = (T0 + i * WINDOW + rng.uniform(0, WINDOW - 1e-3, size=len(entities))).round(3)
            X = np.round(X, 2)
            rows = [template % (e, t, *x) for e, t, x in zip(entities, ts.tolist(), X.tolist())]
            f.writelines(rows)
            n += len(rows)
    return n


def shuffle_lines(src: Path, dst: Path, seed: int = 2) -> None:
    """``dst``: ``src``'s lines in a random order (in a child process: the whole file in memory)."""
    code = ("import sys, numpy as np; lines = open(sys.argv[1], 'rb').read().splitlines(keepends=True); "
            "np.random.default_rng(int(sys.argv[3])).shuffle(lines); open(sys.argv[2], 'wb').write(b''.join(lines))")
    subprocess.run([sys.executable, "-c", code, str(src), str(dst), str(seed)], check=True)


def _vm_kib(field: str) -> int:
    """``/proc/self/status``'s VmHWM (peak resident set) or VmRSS, KiB. Not getrusage's
    ru_maxrss, which a child keeps from its parent across fork and exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(args) -> None:
    """One replay in this process; prints a JSON line of what it measured."""
    from monitor.config import load_config

    if args.module == "new":
        from monitor.stream.replay import replay
    else:
        import importlib.util

        spec = importlib.util.spec_from_file_location("old_replay", args.module)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        replay = mod.replay
    config = load_config(args.config)
    before = _vm_kib("VmRSS")
    t, c = time.perf_counter(), time.process_time()
    s = replay(config, Path(args.input), args.start, args.end, Path(args.output), Path(args.output + ".dead"),
               rng=args.seed, ledger_path=Path(args.ledger))
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(json.dumps({"wall": wall, "cpu": cpu, "maxrss_mib": _vm_kib("VmHWM") / 1024,
                      "start_rss_mib": before / 1024, "accepted": s.get("accepted", 0), "pages": len(s.get("pages", [])),
                      "windows": s.get("windows", 0), "open_windows_peak": s.get("open_windows_peak")}))


def run_child(module: str, tmp: Path, input_path: Path, days: float, out: Path, seed: int = 11) -> dict:
    ledger = out.with_suffix(".sqlite")
    ledger.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", "--module", module, "--config", str(tmp / "config.yaml"),
           "--input", str(input_path), "--start", str(T0), "--end", str(T0 + days * 86400), "--output", str(out),
           "--ledger", str(ledger), "--seed", str(seed)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env)
    if res.returncode != 0:
        raise SystemExit(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def setup(tmp: Path) -> None:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    res = subprocess.run([sys.executable, "-m", "monitor", "fit", "--reference", str(REPO / "monitor/data/reference-vitals.csv"),
                          "--seed", "1"], capture_output=True, text=True, cwd=tmp)
    if res.returncode != 0:
        raise SystemExit(res.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=10000)
    ap.add_argument("--days", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    ap.add_argument("--compare-days", type=float, default=None, help="compare with the parent commit's replay on this size")
    ap.add_argument("--old-rev", default=None, help="the commit whose replay.py to compare with (default: the commit "
                    "before the one that made replay stream)")
    ap.add_argument("--old-file", type=Path, default=None, help="the earlier replay.py to compare with, as a file "
                    "(instead of git show)")
    ap.add_argument("--write", action="store_true", help="write docs/benchmarks/replay.md section `replay`")
    ap.add_argument("--tmp", type=Path, default=None, help="folder for the generated files (default: a temporary one)")
    # one replay in this process (used by the parent)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--module", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--end", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--output", help=argparse.SUPPRESS)
    ap.add_argument("--ledger", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=11, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    began = time.perf_counter()
    load_start = os.getloadavg()
    tmp = args.tmp or Path(tempfile.mkdtemp(prefix="bench-replay-"))
    tmp.mkdir(parents=True, exist_ok=True)
    setup(tmp)
    rows = []
    for days in args.days:
        path = tmp / f"events-{days:g}d.jsonl"
        t = time.perf_counter()
        n = generate(path, args.devices, days)
        gen = time.perf_counter() - t
        m = run_child("new", tmp, path, days, tmp / f"out-{days:g}d.jsonl")
        size = path.stat().st_size / 2**20
        rows.append((days, n, size, m))
        print(f"{days:g} d: {n:,} events, {size:,.0f} MiB (generated in {gen:.0f} s): {m['cpu']:.1f} s CPU, "
              f"{n / m['cpu']:,.0f} events/CPU-s, {n / m['wall']:,.0f} events/s, peak RSS {m['maxrss_mib']:,.0f} MiB, "
              f"{m['pages']} pages, open windows at most {m['open_windows_peak']}", flush=True)
        if days != args.compare_days and days != max(args.days):
            path.unlink()
    compare = None
    if args.compare_days is not None:
        days = args.compare_days
        path = tmp / f"events-{days:g}d.jsonl"
        if not path.exists():
            generate(path, args.devices, days)
        old = tmp / "old_replay.py"
        if args.old_file is not None:
            rev = args.old_rev or "(given file)"
            shutil.copyfile(args.old_file, old)
        else:
            rev = args.old_rev or _streaming_parent()
            old.write_text(subprocess.run(["git", "show", f"{rev}:monitor/stream/replay.py"], capture_output=True,
                                          text=True, cwd=REPO, check=True).stdout)
        shuffled = tmp / f"events-{days:g}d-shuffled.jsonl"
        shuffle_lines(path, shuffled)
        with open(path, "rb") as f:
            lines = sum(1 for _ in f)
        try:
            rev = subprocess.run(["git", "rev-parse", "--short", rev], capture_output=True, text=True, cwd=REPO,
                                 check=True).stdout.strip()
        except (subprocess.CalledProcessError, OSError):
            pass
        compare = {"rev": rev, "days": days, "n": lines, "size": path.stat().st_size / 2**20}
        for label, src in (("sorted", path), ("shuffled", shuffled)):
            new = run_child("new", tmp, src, days, tmp / f"cmp-new-{label}.jsonl")
            was = run_child(str(old), tmp, src, days, tmp / f"cmp-old-{label}.jsonl")
            same = (tmp / f"cmp-new-{label}.jsonl").read_bytes() == (tmp / f"cmp-old-{label}.jsonl").read_bytes()
            windows = len((tmp / f"cmp-new-{label}.jsonl").read_bytes().splitlines())
            compare[label] = {"new": new, "old": was, "same": same, "windows": windows}
            print(f"compare {label}: identical alert records {same} ({windows} windows, {new['pages']} pages); new "
                  f"{new['cpu']:.1f} s CPU {new['maxrss_mib']:,.0f} MiB (open windows at most {new['open_windows_peak']}), "
                  f"old {was['cpu']:.1f} s CPU {was['maxrss_mib']:,.0f} MiB", flush=True)
        shutil.copyfile(tmp / "cmp-new-sorted.jsonl", tmp / "cmp-kept.jsonl")
    seconds = time.perf_counter() - began
    load = (load_start, os.getloadavg())
    if args.write:
        from report import write_run

        # The command without the folders of this run (--tmp, --old-file: the default, git show, gives the same file).
        argv, skip = [], False
        for a in sys.argv[1:]:
            if skip:
                skip = False
            elif a in ("--tmp", "--old-file", "--old-rev"):
                skip = True
            else:
                argv.append(a)
        write_run("replay", "Backtest replay: memory against file size, speed, the same alerts",
                  _markdown(args, rows, compare, load), seconds,
                  command=" ".join(["OMP_NUM_THREADS=1 python bench/bench_replay.py", *argv]))
    if args.tmp is None:
        shutil.rmtree(tmp, ignore_errors=True)


def _streaming_parent() -> str:
    """The commit before the one that made replay stream (its message says so)."""
    log = subprocess.run(["git", "log", "--format=%H %s", "--", "monitor/stream/replay.py"], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout.splitlines()
    for line in log:
        sha, subject = line.split(" ", 1)
        if "two streaming passes" in subject:
            return sha + "^"
    raise SystemExit("no commit that made replay stream: give --old-rev")


def _markdown(args, rows, compare, load) -> str:
    out = [f"{args.devices:,} devices (a daily swing of +-30 %), 5-minute windows, the shipped `config.yaml` (5 features, "
           "one event per device per window), a model fitted on the bundled reference vitals, a fresh `--ledger` and seeded "
           "noise; one fresh process per replay, on one core. Peak resident set: VmHWM of that process (`/proc/self/status`) "
           "(Python, numpy and the model included: about "
           f"{rows[0][3]['start_rss_mib']:,.0f} MiB before the replay starts). Both passes are included in the time "
           "(the digest that picks the ledger, then the replay). Events per CPU-second are the replay's own cost; per wall "
           "second, what the machine's other jobs left it (load average, 1/5/15 min, at the start: "
           f"{'/'.join(f'{x:.2f}' for x in load[0])}, at the end: {'/'.join(f'{x:.2f}' for x in load[1])}; 2 cores, shared).",
           "",
           "| days | events | file (MiB) | CPU s | events per CPU-second | events/s (wall) | peak RSS (MiB) | RSS / file | "
           "open windows at most | pages |", "|---|---|---|---|---|---|---|---|---|---|"]
    for days, n, size, m in rows:
        out.append(f"| {days:g} | {n:,} | {size:,.0f} | {m['cpu']:.1f} | {n / m['cpu']:,.0f} | {n / m['wall']:,.0f} | "
                   f"{m['maxrss_mib']:,.0f} | {m['maxrss_mib'] / size:.2f} | {m['open_windows_peak']} | {m['pages']} |")
    if compare:
        out += ["", f"The same alerts as before: a {compare['days']:g}-day file ({compare['n']:,} events, "
                f"{compare['size']:,.0f} MiB), in time order and with its lines shuffled, replayed by this version and by "
                f"the replay of commit {compare['rev']} (which held the whole file in memory), same seed, fresh ledgers:", "",
                "| file | alert records identical | windows | pages | this version: CPU s, peak RSS (MiB), open windows at most | "
                "before: CPU s, peak RSS (MiB) |", "|---|---|---|---|---|---|"]
        for label in ("sorted", "shuffled"):
            c = compare[label]
            out.append(f"| {label} | {'yes, byte for byte' if c['same'] else '**NO**'} | {c['windows']} | {c['new']['pages']} | "
                       f"{c['new']['cpu']:.1f}, {c['new']['maxrss_mib']:,.0f}, {c['new']['open_windows_peak']} | "
                       f"{c['old']['cpu']:.1f}, {c['old']['maxrss_mib']:,.0f} |")
        out += ["", "A shuffled file holds every window open until the file's last event of it, so its memory grows with "
                "the file; a file in time order (or nearly) holds a few: those one batch of 16,384 lines reaches, and the one "
                "before."]
    return "\n".join(out)


if __name__ == "__main__":
    main()
