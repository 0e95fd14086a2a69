"""What every layer stands on: where things live (`paths`), whole-file writes (`atomic`), "module:Class" registries
(`registry`), secret redaction (`redact`), child processes that die with their parent (`procs`) and the team
store's URL (`storeurl`). Nothing here imports another nemotron package but `errors` (and `warm`, lazily)."""
