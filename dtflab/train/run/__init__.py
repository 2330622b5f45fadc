"""The run machinery every strategy shares: the one ``Runner`` (clock, callbacks, background
thread, Stop), ``RunHistory``, callbacks, the watchdog, checkpoints and recovery, TF1 graphs and
sessions on a cluster, and ``programs`` (starting worker programs and reading their reports).
A strategy supplies its step; this room does the rest. Nothing is imported here."""
