"""The fault suite (issue 13): every fault a cluster produces, injected into every patch and into align/compare.

A package so that its ``conftest.py`` (the summary table) is ``faults.conftest``, never a second
``conftest`` module beside ``tests/conftest.py``, which the other tests import by that name.
"""
