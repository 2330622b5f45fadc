"""How a task process starts, and what runs inside it."""
