"""The private network task servers live on, and the bytes counted at their sockets."""
