"""The network room: where task servers listen, and the bytes that cross their sockets.

``networks`` chooses a cluster's network (this machine's, or a private one) and lists what
other hosts can reach; ``gate`` is the private network's gate process (both ends of its
protocol, and it starts itself); ``netns`` holds the Linux namespace calls; ``transport``
counts bytes at every task's TCP sockets.

May import: dtflab's base modules only (``errors``). The table in ``tests/test_layers.py`` is
the rule.
"""
