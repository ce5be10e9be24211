"""What kvscope's tests share: paths, tools the tests need, real servers and publishers to test against.

Importable as `testkit` while the suite runs (pytest's `pythonpath = ["tests/lib"]`); `make fuzz` and the
benches put tests/lib on the path themselves.
"""
