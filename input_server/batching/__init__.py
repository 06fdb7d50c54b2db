"""From documents to batches: `Pipeline` opens a spec's source, order and tokenizer (`data`);
a stream reads and tokenizes groups of its ordered documents in a parallel stage (Grain's
workers, `encode`), then packs them in order into MaxText-format batches, each with the resume
state after it (`BatchStream`, `pack`, `resume`), while `meter` counts what each part did."""
