"""Train every system of the comparison tables under one protocol, measure each run, and write the report.

    python train_scripts/compare.py                                   # the CPU protocol, every table, En-De
    python train_scripts/compare.py --report_only --readme README.md  # rebuild docs/results.md and the README's

`--help` lists every flag. The comparison lives in `hf_posenc/study/`: its tables and claims, the runs (each
trained and measured in a process of its own), the checks of the recorded results and the report.
"""

from hf_posenc.study.cli import cli

if __name__ == "__main__":
    cli()
