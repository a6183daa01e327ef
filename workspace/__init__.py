"""The /v1 data workspace API: spaces, tables, rows, functions, notebooks, auth."""
