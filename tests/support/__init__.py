"""Shared test plumbing: the lab's status and skip rule, ssh to the lab, inventories, playbook runs.

One concept, one place (issue 13): every test and benchmark reads the lab, reaches the
PVE host or a container, writes an inventory and runs a playbook through these modules
instead of its own copy. Importing ``tests.support.paths`` (done by tests/conftest.py)
puts the collection and the lab's helper directories on ``sys.path`` once.
"""
