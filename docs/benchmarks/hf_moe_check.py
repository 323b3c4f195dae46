# transformers reads kiln's mixture-of-experts checkpoint as MixtralForCausalLM
# and gives kiln's fp32 logits. Run on the GPU host after
#   KILN_MOE_OUT=/tmp/moe trainer.test -test.run TestMoERunOnTheGPU
# which trains 200 steps and leaves the run in /tmp/moe with kiln's fp32 logits
# of the last checkpoint on one sequence (kiln_logits.safetensors).
import json, sys
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import MixtralForCausalLM

out = sys.argv[1]
with safe_open(out + "/kiln_logits.safetensors", "pt") as f:
    ck = f.metadata()["checkpoint"]
ref = load_file(out + "/kiln_logits.safetensors")
m = MixtralForCausalLM.from_pretrained(ck, dtype=torch.float32, attn_implementation="eager").eval()
with torch.no_grad():
    got = m(input_ids=ref["input_ids"].long()).logits
d = (got - ref["logits"]).abs().max().item()
print(json.dumps(dict(checkpoint=ck, model=type(m).__name__, max_abs_diff=d, pass_=d <= 1e-4)))
