"""The pieces of training graphs that loops build, none of them a loop: one copy of the model
(``one_replica``: single, model parallel, gradient accumulation), a transformer's blocks cut
Megatron-style (``tensor_parallel_blocks``), ring attention (``ring_attention``) and the
zero-bubble schedules' split of a backward (``backward_split``). Nothing is imported here."""
