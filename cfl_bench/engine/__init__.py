"""The federation loop: server, clients, local steps, evaluation and communication counting."""
