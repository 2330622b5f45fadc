"""The run machinery every strategy shares: the one ``Runner`` (clock, callbacks, background
thread, Stop), ``RunHistory``, callbacks, the watchdog, checkpoints and recovery, TF1 graphs and
sessions on a cluster, ``program_loops`` (what the loops that train in worker programs share:
starting them, reading their reports) and ``traced_memory`` (a traced step's bytes by kind).
A strategy supplies its step; this room does the rest. Nothing is imported here."""
