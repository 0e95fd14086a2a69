"""Score sentences with the reward server of the job's other group ($NEMOTRON_REWARD_URL, bearer token from the
job's secrets file), and register one record per sentence with its score and where it was scored."""

import json
import os

from nemotron.reward.client import RewardClient
from nemotron.runtime.step import StepRun

run = StepRun.start(__file__)
url = os.environ["NEMOTRON_REWARD_URL"]
client = RewardClient(url, os.environ["NEMOTRON_REWARD_TOKEN"], timeout=30, retries=3)
scores = client.score(run.config.sentences)
node = os.environ.get("SLURMD_NODENAME", "")
print(f"scored {len(scores)} sentences at {url} from {node}", flush=True)
out = run.output_dir("scores").with_suffix(".jsonl")
rows = [
    {"prompt": s, "score": v, "server": url, "client_node": node}
    for s, v in zip(run.config.sentences, scores, strict=True)
]
out.write_text("".join(json.dumps(r) + "\n" for r in rows))
run.register_outputs({"scores": out})
