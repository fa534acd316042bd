"""Fixtures shared by the pearl unit tests: a tiny random Llama checkpoint and its greedy reference."""
import pytest
from pearl_helpers import VOCAB
from redis_helpers import redis_server  # noqa: F401 - a real redis-server for tests/test_redis_state.py


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A 2-layer Llama with random weights, saved like a real checkpoint (no tokenizer)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )
    path = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def reference(tiny_dir):
    """Greedy next token of the same weights, recomputed from scratch (no KV cache) every time."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    lm = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()

    @torch.no_grad()
    def greedy(prefix, n):
        seq = list(prefix)
        for _ in range(n):
            seq.append(int(lm(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
        return seq[len(prefix) :]

    return greedy
