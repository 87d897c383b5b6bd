"""What ``AGBoss(app)`` installs on each worker beside the signals.

``store_check``: what a worker says about its store at start, and until it answers;
``held_messages``: the payment messages a worker fetched and has not started, listed
in the store so the sweep re-publishes a dead worker's at once.
"""
