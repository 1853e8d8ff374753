"""Doctor mode (`probe --doctor`): the facts of a live host, venv or container, and the findings over them."""
