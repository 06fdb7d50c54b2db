"""`input-server tokenizer train`: make a sentencepiece model for your own corpus."""

from __future__ import annotations

import argparse
import os

from input_server.data.tokenizers.corpus_trainer import DEFAULT_VOCAB, NORMALIZATIONS, train
from input_server.data.tokenizers.train_progress import PROGRESS_EVERY_S
from input_server.plurals import plural


def _vocab_size(text: str) -> int:
    value = int(text)
    if value < 8:  # the four special pieces and a few characters
        raise argparse.ArgumentTypeError(f"must be at least 8, got {text!r}")
    return value


def register(subparsers) -> None:
    """`tokenizer` and its one verb, `train`."""
    tokenizer = subparsers.add_parser(
        "tokenizer", help="make a sentencepiece model for your own corpus"
    )
    verbs = tokenizer.add_subparsers(dest="tokenizer_command", required=True)
    p = verbs.add_parser(
        "train",
        help="train a sentencepiece model the server accepts",
        description="Trains a sentencepiece model on jsonl (plain, .gz, .zst) or plain-text "
        "files, with pad 0, bos 1, eos 2 and unk 3 (MaxText's convention: 0 pads the "
        "batches), and writes it to MODEL.",
    )
    p.add_argument("corpus", nargs="+", metavar="CORPUS", help="jsonl or text files")
    p.add_argument("-o", "--output", required=True, metavar="MODEL", help="the model file to write")
    p.add_argument(
        "--vocab-size",
        type=_vocab_size,
        default=DEFAULT_VOCAB,
        help=f"pieces in the vocabulary (default {DEFAULT_VOCAB}); a corpus too small for "
        "it is refused, naming the most it supports",
    )
    p.add_argument(
        "--model-type",
        choices=("unigram", "bpe"),
        default="unigram",
        help="unigram (sentencepiece's default) or bpe (the server grows a cut document's "
        "tokens without tokenizing it again)",
    )
    p.add_argument(
        "--text-field",
        default="text",
        metavar="F",
        help="the JSON key holding each document's text (default text), as the spec's "
        "source.text_field",
    )
    p.add_argument(
        "--format",
        choices=("auto", "jsonl", "text"),
        default="auto",
        help="auto (default): jsonl for .jsonl/.json/.ndjson names, else text, a document a line",
    )
    p.add_argument(
        "--no-pad",
        action="store_true",
        help="no pad piece (as Llama 2's model): MaxText then pads with -1",
    )
    p.add_argument(
        "--normalization",
        choices=NORMALIZATIONS,
        default="identity",
        help="sentencepiece's normalization rule (default identity: text kept as written, as "
        "Llama's and Gemma's models; nmt_nfkc is sentencepiece's own default, which also turns "
        "newlines and tabs into spaces)",
    )
    p.add_argument(
        "--collapse-whitespace",
        action="store_true",
        help="remove leading, trailing and repeated spaces (sentencepiece's default); without "
        "it indentation and double spaces decode back as written",
    )
    p.add_argument(
        "--no-byte-fallback",
        action="store_true",
        help="map characters the vocabulary lacks (newlines included) to unk instead of their "
        "UTF-8 bytes (sentencepiece's default); byte fallback needs 256 more pieces",
    )
    p.add_argument(
        "--progress-every",
        type=float,
        default=PROGRESS_EVERY_S,
        metavar="S",
        help=f"a progress line on stderr every S seconds (default {PROGRESS_EVERY_S:g}; 0 = none)",
    )


def run(args: argparse.Namespace) -> int:
    made = train(
        args.corpus,
        args.output,
        vocab_size=args.vocab_size,
        model_type=args.model_type,
        text_field=args.text_field,
        fmt=args.format,
        with_pad=not args.no_pad,
        normalization=args.normalization,
        keep_whitespace=not args.collapse_whitespace,
        byte_fallback=not args.no_byte_fallback,
        progress_every_s=max(0.0, args.progress_every),
    )
    ids = ", ".join(
        f"{k} {made[f'{k}_id']}" for k in ("pad", "bos", "eos", "unk") if made[f"{k}_id"] >= 0
    )
    print(
        f"wrote {made['model']}: {made['model_type']}, {made['vocab_size']:,} pieces ({ids}), "
        f"from {plural(made['documents'], 'document')} ({plural(made['lines'], 'line')}) in "
        f"{plural(made['files'], 'file')}; {made['normalization']} normalization, "
        f"whitespace {'kept' if made['keep_whitespace'] else 'collapsed'}, "
        f"{'byte fallback' if made['byte_fallback'] else 'unknown characters to unk'}"
    )
    print(f'in a spec: [tokenizer] model = "{os.path.abspath(made["model"])}"')
    return 0
