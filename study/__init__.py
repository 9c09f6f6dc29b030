"""The comparison of every positional module (`python -m study`, docs/results.md), apart from the library
and the model: no model file imports it, and it knows the modules only through the registries
(`benchmarks.systems`).

    tables.py   the systems: the main table from the registries, the ablation tables' rows, the reference system
    claims.py   the papers' claims as the papers state them, the margin, and the verdict rules
    bootstrap.py  the seeds × sentences bootstrap interval behind the equivalence and non-inferiority tests
    runs.py     a run (system, pair, seed): planning, training and measuring in a process of its own, recording
    results.py  the recorded results: checked up front, read for the report
    report.py   docs/results.md; length.py its length-generalisation section; verdicts.py its claims sections;
                readme.py the README's results
    cli.py      the command line
"""
