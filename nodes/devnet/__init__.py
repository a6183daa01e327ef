"""The devnet: anvil as the execution client, installed and started by chainstate."""
