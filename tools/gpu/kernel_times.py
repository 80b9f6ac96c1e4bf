#!/usr/bin/env python3
"""Per-kernel GPU time of one decode step, from an Nsight Compute CSV.

The decode step runs as a CUDA graph; Nsight Compute (`ncu --graph-profiling node`) times each
of its kernels on its own (caches left warm, clocks not locked), so the sum here is the step's
kernel time without the gaps between kernels (the bench's step time minus this sum is what
launches and boundaries cost). Run on the GPU machine (tools/gpu/kernel_times.sh does both):

  ncu --graph-profiling node --cache-control none --clock-control none \\
      --metrics gpu__time_duration.sum --csv --page raw deepinfer-bench ... > ncu.csv
  python3 kernel_times.py ncu.csv [--steps 3]

The bench runs the same decode step again and again at the end, so the kernel names of the last
launches repeat with the step's kernel count as their period: the script finds the smallest
period P whose last `--steps` repetitions agree name for name, and reports those steps' kernels
grouped by name (calls per step, microseconds per step, share of the summed kernel time).
"""
import argparse
import csv
import sys

TIME_METRIC = "gpu__time_duration.sum"


def read_launches(lines):
    """[(kernel name, duration in us)] in launch order from ncu's raw CSV page."""
    rows = list(csv.reader(lines))
    header_at = next((i for i, r in enumerate(rows) if "Kernel Name" in r and TIME_METRIC in r),
                     None)
    if header_at is None:
        raise ValueError(f"no header with 'Kernel Name' and '{TIME_METRIC}' in the CSV")
    header = rows[header_at]
    name_col, time_col = header.index("Kernel Name"), header.index(TIME_METRIC)
    body = rows[header_at + 1:]
    scale = 1e-3  # ncu reports nanoseconds unless its units row says otherwise
    if body and body[0] and not body[0][0].strip().isdigit():  # the units row
        unit = body[0][time_col].strip()
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
                 "msecond": 1e3}.get(unit)
        if scale is None:
            raise ValueError(f"unknown time unit '{unit}' for {TIME_METRIC}")
        body = body[1:]
    launches = []
    for r in body:
        if len(r) <= max(name_col, time_col) or not r[time_col].strip():
            continue
        launches.append((r[name_col], float(r[time_col].replace(",", "")) * scale))
    return launches


def step_period(names, steps, min_kernels):
    """Smallest P >= min_kernels with names[-steps*P:] made of `steps` equal blocks, or None.

    The layers inside a step repeat too, but the step's last kernels (final norm, lm_head,
    sampling) run once per step, so the smallest period that repeats at the very end is the step.
    """
    for p in range(min_kernels, len(names) // steps + 1):
        tail = names[len(names) - steps * p:]
        if all(tail[i] == tail[i % p] for i in range(len(tail))):
            return p
    return None


LAUNCH_WRAPPERS = ("void launch_internal::PrefetchWaitThenRun<&", "void launch_internal::WaitThenRun<&",
                   "launch_internal::PrefetchWaitThenRun<&", "launch_internal::WaitThenRun<&")


def short_name(name, width=100):
    """The kernel's name without our launch wrappers and anonymous namespace, cut to `width`."""
    for w in LAUNCH_WRAPPERS:
        if name.startswith(w):
            name = name[len(w):]
            break
    name = name.replace("deepinfer::<unnamed>::", "").replace("deepinfer::", "")
    if name.startswith("void "):
        name = name[len("void "):]
    return name if len(name) <= width else name[:width - 3] + "..."


def summarize(launches, steps, min_kernels=4, order=False):
    names = [n for n, _ in launches]
    p = step_period(names, steps, min_kernels)
    if p is None:
        raise ValueError(f"the last launches do not repeat {steps} times: is the bench's decode "
                         "running at the end of the profile?")
    tail = launches[len(launches) - steps * p:]
    per_name = {}
    for name, us in tail:
        calls, total = per_name.get(name, (0, 0.0))
        per_name[name] = (calls + 1, total + us)
    total = sum(us for _, us in tail) / steps
    out = [f"kernels per decode step: {p}, summed kernel time per step: {total:.1f} us "
           f"(mean of the last {steps} steps)"]
    for name, (calls, us) in sorted(per_name.items(), key=lambda kv: -kv[1][1]):
        out.append(f"  {us / steps:9.1f} us {100.0 * us / steps / total:5.1f}%  "
                   f"{calls // steps:4d} calls  {short_name(name)}")
    if order:
        out.append("the last step's kernels in launch order:")
        for i, (name, us) in enumerate(tail[len(tail) - p:]):
            out.append(f"  {i:4d} {us:9.1f} us  {short_name(name)}")
    return "\n".join(out)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu --csv --page raw output ('-' for standard input)")
    ap.add_argument("--steps", type=int, default=3, help="repeated decode steps to average")
    ap.add_argument("--order", action="store_true",
                    help="also list the last step's kernels in launch order")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    f = sys.stdin if args.csv == "-" else open(args.csv, newline="")
    try:
        print(summarize(read_launches(f), args.steps, order=args.order))
    except ValueError as e:
        print(f"kernel_times.py: {args.csv}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
