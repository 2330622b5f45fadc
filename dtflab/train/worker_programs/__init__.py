"""What runs inside a worker program's process (``train.all_reduce``,
``train.sharded_data_parallel``): each program's file, named like the strategy it serves, the
step loop they share (``loop``) and the contract with the notebook (``contract``: flags and
report messages). Nothing here imports the notebook side (``tests/test_layers.py`` checks)."""
