"""chatq benchmarks (issue 6): `python -m bench [NAME ...]`; see BENCHMARKS.md."""
