"""The gRPC server: `Server`'s lifecycle, and a servicer that admits each `StreamBatches` call
as a `Stream`; its session produces `batching`'s batches on a thread, ahead of the sender by a
bounded queue, and they go out coalesced into messages as far as the client's credit allows."""
