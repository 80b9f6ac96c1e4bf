"""The command line both fixture generators share (tools/make_fixtures.py for DeepSeek-V3,
tools/make_fixtures_v4.py for DeepSeek-V4): --out DIR and --only NAME ..., checked against the
script's fixture table, then torch's thread count and the versions that made the fixtures.

  args, names = fixture_cli.parse(FIXTURES, __doc__)   # names: the fixtures to make, in order
"""
import argparse
import os


def parse(fixtures, description=None):
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory that receives one folder per fixture")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME",
                    help="make only these fixtures (the others are left as they are)")
    args = ap.parse_args()
    unknown = sorted(set(args.only or []) - set(fixtures))
    if unknown:
        ap.error(f"unknown fixture(s) {unknown}; known: {sorted(fixtures)}")
    import torch
    import transformers
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    print("transformers", transformers.__version__, "torch", torch.__version__)
    return args, [n for n in fixtures if not args.only or n in args.only]
