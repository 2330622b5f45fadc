"""The processes room: how a task process starts, and what runs inside it.

``spawn`` starts a fresh interpreter; ``forkserver`` forks tasks from a process that has
imported TensorFlow once (both ends of its protocol); ``launch`` chooses between them and owns
this process's fork servers. The entry points that run inside a task process, ``server`` (a
bare task server, also ``dtflab server``) and ``script`` (a program task: the user's script), share
``inside`` and import nothing from the code that started them (``launch``, ``spawn``,
``forkserver``, ``dtflab.cluster``).

May import: ``dtflab.network`` (joining the private network) and dtflab's base modules
(``spec``, ``errors``, ``_quiet``, ``tf_private``, ``allocator``). The table in ``tests/test_layers.py`` is
the rule.
"""
