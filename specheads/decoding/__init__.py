"""How draft heads are used: tree, draft, verify, accept, cache commit, generate."""
