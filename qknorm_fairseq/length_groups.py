"""`--length-groups K`: a training batch computed as K groups of sentences of similar target length.

fairseq sorts the training sentences by source length and pads every batch to its longest target,
so the decoder computes padding: on TED gl->en, 38.7% of the target positions of an epoch are pad
tokens (source side: 0.7%), and the decoder and the output layer do most of an update's arithmetic.
Here each batch is sorted by target length, split into K groups of (nearly) equal size, and each
group is trimmed to its own longest source and target; the task runs forward and backward on one
group after the other and the gradients add up in the parameters, as fairseq's --update-freq adds
up batches. The loss sums over the same sentences and the gradient is the same up to the order of
the sums: a sentence's output does not depend on the others in its batch, nor on its padding (pads
are masked, and the targets are padded after their end, which the causal decoder never reads).
Dropout draws other masks than the one-group run, so a run is not the bit-for-bit twin of one
without the flag. Each group is one more pass of the framework's per-op cost, so a few groups pay
and many do not (`bash scripts/benchmark.sh fairseq-train` measures it); on a GPU the split reads
the lengths on the host, one sync per batch.
"""
import torch

BATCH_KEYS = ("src_tokens", "src_lengths", "prev_output_tokens")


def _trimmed(tokens, pad):
    """TOKENS (rows, columns) without the columns that are padding in every row (left or right;
    every row holds at least its EOS)."""
    used = tokens.ne(pad).any(dim=0).nonzero().squeeze(1)
    return tokens[:, int(used[0]):int(used[-1]) + 1].contiguous()  # fairseq's criteria .view() the target


def split_by_target_length(sample, k, pad):
    """SAMPLE (a fairseq translation batch) as min(K, its sentences) samples, sorted by target
    length, each trimmed to its longest source and target; their ntokens add up to SAMPLE's."""
    target = sample["target"]
    unknown = set(sample["net_input"]) - set(BATCH_KEYS)
    if unknown:
        raise ValueError(f"--length-groups splits translation batches only; this one has net_input "
                         f"{', '.join(sorted(unknown))}: drop --length-groups")
    lengths = target.ne(pad).sum(dim=1)
    order = torch.sort(lengths, stable=True).indices
    groups = []
    for rows in torch.tensor_split(order, min(k, len(order))):
        net_input = {key: value.index_select(0, rows) for key, value in sample["net_input"].items()}
        net_input["src_tokens"] = _trimmed(net_input["src_tokens"], pad)
        net_input["prev_output_tokens"] = _trimmed(net_input["prev_output_tokens"], pad)
        groups.append({"id": sample["id"].index_select(0, rows), "nsentences": len(rows),
                       "ntokens": int(lengths.index_select(0, rows).sum()), "net_input": net_input,
                       "target": _trimmed(target.index_select(0, rows), pad)})
    return groups


def merged_logs(logs):
    """One logging output of a batch from its groups': fairseq's criteria log sums."""
    out = {}
    for log in logs:
        for key, value in log.items():
            out[key] = out[key] + value if key in out else value
    return out
