from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Source(_message.Message):
    __slots__ = ("paths", "format", "text_field", "record_format", "token_field", "weight", "name")
    PATHS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_FIELD_NUMBER: _ClassVar[int]
    RECORD_FORMAT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    paths: _containers.RepeatedScalarFieldContainer[str]
    format: str
    text_field: str
    record_format: str
    token_field: str
    weight: float
    name: str
    def __init__(self, paths: _Optional[_Iterable[str]] = ..., format: _Optional[str] = ..., text_field: _Optional[str] = ..., record_format: _Optional[str] = ..., token_field: _Optional[str] = ..., weight: _Optional[float] = ..., name: _Optional[str] = ...) -> None: ...

class Tokenizer(_message.Message):
    __slots__ = ("model", "add_bos", "add_eos", "vocab_size", "pad_id", "bos_id", "eos_id", "kind", "backend")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADD_BOS_FIELD_NUMBER: _ClassVar[int]
    ADD_EOS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAD_ID_FIELD_NUMBER: _ClassVar[int]
    BOS_ID_FIELD_NUMBER: _ClassVar[int]
    EOS_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    model: str
    add_bos: bool
    add_eos: bool
    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    kind: str
    backend: str
    def __init__(self, model: _Optional[str] = ..., add_bos: bool = ..., add_eos: bool = ..., vocab_size: _Optional[int] = ..., pad_id: _Optional[int] = ..., bos_id: _Optional[int] = ..., eos_id: _Optional[int] = ..., kind: _Optional[str] = ..., backend: _Optional[str] = ...) -> None: ...

class TokenizerInfo(_message.Message):
    __slots__ = ("vocab_size", "bos_id", "eos_id", "pad_id", "unk_id", "sha256")
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    BOS_ID_FIELD_NUMBER: _ClassVar[int]
    EOS_ID_FIELD_NUMBER: _ClassVar[int]
    PAD_ID_FIELD_NUMBER: _ClassVar[int]
    UNK_ID_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int
    unk_id: int
    sha256: str
    def __init__(self, vocab_size: _Optional[int] = ..., bos_id: _Optional[int] = ..., eos_id: _Optional[int] = ..., pad_id: _Optional[int] = ..., unk_id: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class BatchShape(_message.Message):
    __slots__ = ("seq_len", "size", "packing", "long_documents")
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PACKING_FIELD_NUMBER: _ClassVar[int]
    LONG_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    seq_len: int
    size: int
    packing: str
    long_documents: str
    def __init__(self, seq_len: _Optional[int] = ..., size: _Optional[int] = ..., packing: _Optional[str] = ..., long_documents: _Optional[str] = ...) -> None: ...

class Order(_message.Message):
    __slots__ = ("seed", "shuffle", "epochs")
    SEED_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    seed: int
    shuffle: bool
    epochs: int
    def __init__(self, seed: _Optional[int] = ..., shuffle: bool = ..., epochs: _Optional[int] = ...) -> None: ...

class Shard(_message.Message):
    __slots__ = ("index", "count")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    index: int
    count: int
    def __init__(self, index: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class Workers(_message.Message):
    __slots__ = ("count", "ram_budget_mb", "max_workers", "target_batches_per_s", "tune_seconds", "threads")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    RAM_BUDGET_MB_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    TARGET_BATCHES_PER_S_FIELD_NUMBER: _ClassVar[int]
    TUNE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    count: str
    ram_budget_mb: int
    max_workers: int
    target_batches_per_s: float
    tune_seconds: float
    threads: int
    def __init__(self, count: _Optional[str] = ..., ram_budget_mb: _Optional[int] = ..., max_workers: _Optional[int] = ..., target_batches_per_s: _Optional[float] = ..., tune_seconds: _Optional[float] = ..., threads: _Optional[int] = ...) -> None: ...

class PipelineSpec(_message.Message):
    __slots__ = ("source", "tokenizer", "batch", "order", "shard", "workers", "mixture")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    MIXTURE_FIELD_NUMBER: _ClassVar[int]
    source: Source
    tokenizer: Tokenizer
    batch: BatchShape
    order: Order
    shard: Shard
    workers: Workers
    mixture: _containers.RepeatedCompositeFieldContainer[Source]
    def __init__(self, source: _Optional[_Union[Source, _Mapping]] = ..., tokenizer: _Optional[_Union[Tokenizer, _Mapping]] = ..., batch: _Optional[_Union[BatchShape, _Mapping]] = ..., order: _Optional[_Union[Order, _Mapping]] = ..., shard: _Optional[_Union[Shard, _Mapping]] = ..., workers: _Optional[_Union[Workers, _Mapping]] = ..., mixture: _Optional[_Iterable[_Union[Source, _Mapping]]] = ...) -> None: ...

class StreamBatchesRequest(_message.Message):
    __slots__ = ("spec", "pipeline_name", "resume_state", "protocol_version", "batches_taken", "window", "data_wait_s")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_NAME_FIELD_NUMBER: _ClassVar[int]
    RESUME_STATE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    BATCHES_TAKEN_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    DATA_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    spec: PipelineSpec
    pipeline_name: str
    resume_state: bytes
    protocol_version: int
    batches_taken: int
    window: int
    data_wait_s: float
    def __init__(self, spec: _Optional[_Union[PipelineSpec, _Mapping]] = ..., pipeline_name: _Optional[str] = ..., resume_state: _Optional[bytes] = ..., protocol_version: _Optional[int] = ..., batches_taken: _Optional[int] = ..., window: _Optional[int] = ..., data_wait_s: _Optional[float] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("sequence_number", "tensors", "state", "end_of_data", "num_tokens", "following")
    SEQUENCE_NUMBER_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    END_OF_DATA_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FOLLOWING_FIELD_NUMBER: _ClassVar[int]
    sequence_number: int
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    state: bytes
    end_of_data: bool
    num_tokens: int
    following: _containers.RepeatedCompositeFieldContainer[Batch]
    def __init__(self, sequence_number: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., state: _Optional[bytes] = ..., end_of_data: bool = ..., num_tokens: _Optional[int] = ..., following: _Optional[_Iterable[_Union[Batch, _Mapping]]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StreamInfo(_message.Message):
    __slots__ = ("stream_id", "pipeline", "worker_processes", "worker_threads", "batches_sent", "worker_reason", "batches_produced", "worker_tuning", "consumed_batches_per_s", "batches_taken", "switches", "demand_batches_per_s", "tuning_state", "stats", "tokenizer_backend", "tokenizer_backend_why", "audited_groups", "audit_mismatches", "backend_failed_groups", "tokenizer_backend_pending", "backend_groups")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    WORKER_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    WORKER_THREADS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_SENT_FIELD_NUMBER: _ClassVar[int]
    WORKER_REASON_FIELD_NUMBER: _ClassVar[int]
    BATCHES_PRODUCED_FIELD_NUMBER: _ClassVar[int]
    WORKER_TUNING_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_BATCHES_PER_S_FIELD_NUMBER: _ClassVar[int]
    BATCHES_TAKEN_FIELD_NUMBER: _ClassVar[int]
    SWITCHES_FIELD_NUMBER: _ClassVar[int]
    DEMAND_BATCHES_PER_S_FIELD_NUMBER: _ClassVar[int]
    TUNING_STATE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_BACKEND_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_BACKEND_WHY_FIELD_NUMBER: _ClassVar[int]
    AUDITED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    AUDIT_MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FAILED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_BACKEND_PENDING_FIELD_NUMBER: _ClassVar[int]
    BACKEND_GROUPS_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    pipeline: str
    worker_processes: int
    worker_threads: int
    batches_sent: int
    worker_reason: str
    batches_produced: int
    worker_tuning: WorkerTuning
    consumed_batches_per_s: float
    batches_taken: int
    switches: _containers.RepeatedCompositeFieldContainer[WorkerSwitch]
    demand_batches_per_s: float
    tuning_state: str
    stats: StreamStats
    tokenizer_backend: str
    tokenizer_backend_why: str
    audited_groups: int
    audit_mismatches: int
    backend_failed_groups: int
    tokenizer_backend_pending: bool
    backend_groups: int
    def __init__(self, stream_id: _Optional[int] = ..., pipeline: _Optional[str] = ..., worker_processes: _Optional[int] = ..., worker_threads: _Optional[int] = ..., batches_sent: _Optional[int] = ..., worker_reason: _Optional[str] = ..., batches_produced: _Optional[int] = ..., worker_tuning: _Optional[_Union[WorkerTuning, _Mapping]] = ..., consumed_batches_per_s: _Optional[float] = ..., batches_taken: _Optional[int] = ..., switches: _Optional[_Iterable[_Union[WorkerSwitch, _Mapping]]] = ..., demand_batches_per_s: _Optional[float] = ..., tuning_state: _Optional[str] = ..., stats: _Optional[_Union[StreamStats, _Mapping]] = ..., tokenizer_backend: _Optional[str] = ..., tokenizer_backend_why: _Optional[str] = ..., audited_groups: _Optional[int] = ..., audit_mismatches: _Optional[int] = ..., backend_failed_groups: _Optional[int] = ..., tokenizer_backend_pending: bool = ..., backend_groups: _Optional[int] = ...) -> None: ...

class StageTime(_message.Message):
    __slots__ = ("stage", "seconds")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    stage: str
    seconds: float
    def __init__(self, stage: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class StreamStats(_message.Message):
    __slots__ = ("age_s", "stages", "real_tokens", "padding_tokens", "bytes_sent", "queue_fill", "queue_depth", "client_wait_s", "client_wait_share", "production_batches_per_s", "verdict_kind", "verdict")
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    REAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PADDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FILL_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    CLIENT_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    CLIENT_WAIT_SHARE_FIELD_NUMBER: _ClassVar[int]
    PRODUCTION_BATCHES_PER_S_FIELD_NUMBER: _ClassVar[int]
    VERDICT_KIND_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    age_s: float
    stages: _containers.RepeatedCompositeFieldContainer[StageTime]
    real_tokens: int
    padding_tokens: int
    bytes_sent: int
    queue_fill: int
    queue_depth: int
    client_wait_s: float
    client_wait_share: float
    production_batches_per_s: float
    verdict_kind: str
    verdict: str
    def __init__(self, age_s: _Optional[float] = ..., stages: _Optional[_Iterable[_Union[StageTime, _Mapping]]] = ..., real_tokens: _Optional[int] = ..., padding_tokens: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., queue_fill: _Optional[int] = ..., queue_depth: _Optional[int] = ..., client_wait_s: _Optional[float] = ..., client_wait_share: _Optional[float] = ..., production_batches_per_s: _Optional[float] = ..., verdict_kind: _Optional[str] = ..., verdict: _Optional[str] = ...) -> None: ...

class WorkerSwitch(_message.Message):
    __slots__ = ("at_s", "from_processes", "from_threads", "to_processes", "to_threads", "reason", "capacity_batches_per_s", "demand_batches_per_s")
    AT_S_FIELD_NUMBER: _ClassVar[int]
    FROM_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    FROM_THREADS_FIELD_NUMBER: _ClassVar[int]
    TO_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    TO_THREADS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BATCHES_PER_S_FIELD_NUMBER: _ClassVar[int]
    DEMAND_BATCHES_PER_S_FIELD_NUMBER: _ClassVar[int]
    at_s: float
    from_processes: int
    from_threads: int
    to_processes: int
    to_threads: int
    reason: str
    capacity_batches_per_s: float
    demand_batches_per_s: float
    def __init__(self, at_s: _Optional[float] = ..., from_processes: _Optional[int] = ..., from_threads: _Optional[int] = ..., to_processes: _Optional[int] = ..., to_threads: _Optional[int] = ..., reason: _Optional[str] = ..., capacity_batches_per_s: _Optional[float] = ..., demand_batches_per_s: _Optional[float] = ...) -> None: ...

class WorkerMeasurement(_message.Message):
    __slots__ = ("processes", "threads", "batches_per_s", "tokens_per_s", "rss_mb_per_worker", "cpu_cores", "startup_s", "skipped")
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_PER_S_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    RSS_MB_PER_WORKER_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    STARTUP_S_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    processes: int
    threads: int
    batches_per_s: float
    tokens_per_s: float
    rss_mb_per_worker: float
    cpu_cores: float
    startup_s: float
    skipped: str
    def __init__(self, processes: _Optional[int] = ..., threads: _Optional[int] = ..., batches_per_s: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., rss_mb_per_worker: _Optional[float] = ..., cpu_cores: _Optional[float] = ..., startup_s: _Optional[float] = ..., skipped: _Optional[str] = ...) -> None: ...

class WorkerTuning(_message.Message):
    __slots__ = ("reason", "measurements", "processes", "threads", "target_batches_per_s", "tune_seconds")
    REASON_FIELD_NUMBER: _ClassVar[int]
    MEASUREMENTS_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    TARGET_BATCHES_PER_S_FIELD_NUMBER: _ClassVar[int]
    TUNE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    reason: str
    measurements: _containers.RepeatedCompositeFieldContainer[WorkerMeasurement]
    processes: int
    threads: int
    target_batches_per_s: float
    tune_seconds: float
    def __init__(self, reason: _Optional[str] = ..., measurements: _Optional[_Iterable[_Union[WorkerMeasurement, _Mapping]]] = ..., processes: _Optional[int] = ..., threads: _Optional[int] = ..., target_batches_per_s: _Optional[float] = ..., tune_seconds: _Optional[float] = ...) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("server_version", "pipelines", "streams", "protocol_version", "totals")
    class PipelinesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: PipelineSpec
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[PipelineSpec, _Mapping]] = ...) -> None: ...
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    PIPELINES_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    server_version: str
    pipelines: _containers.MessageMap[str, PipelineSpec]
    streams: _containers.RepeatedCompositeFieldContainer[StreamInfo]
    protocol_version: int
    totals: ServerTotals
    def __init__(self, server_version: _Optional[str] = ..., pipelines: _Optional[_Mapping[str, PipelineSpec]] = ..., streams: _Optional[_Iterable[_Union[StreamInfo, _Mapping]]] = ..., protocol_version: _Optional[int] = ..., totals: _Optional[_Union[ServerTotals, _Mapping]] = ...) -> None: ...

class ServerTotals(_message.Message):
    __slots__ = ("batches_sent", "real_tokens", "padding_tokens", "bytes_sent", "stages", "client_wait_s", "stream_ends", "streams_opened", "audited_groups", "audit_mismatches", "backend_failed_groups", "backend_groups")
    class StreamEndsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    BATCHES_SENT_FIELD_NUMBER: _ClassVar[int]
    REAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PADDING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    STREAM_ENDS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_OPENED_FIELD_NUMBER: _ClassVar[int]
    AUDITED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    AUDIT_MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FAILED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_GROUPS_FIELD_NUMBER: _ClassVar[int]
    batches_sent: int
    real_tokens: int
    padding_tokens: int
    bytes_sent: int
    stages: _containers.RepeatedCompositeFieldContainer[StageTime]
    client_wait_s: float
    stream_ends: _containers.ScalarMap[str, int]
    streams_opened: int
    audited_groups: int
    audit_mismatches: int
    backend_failed_groups: int
    backend_groups: int
    def __init__(self, batches_sent: _Optional[int] = ..., real_tokens: _Optional[int] = ..., padding_tokens: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., stages: _Optional[_Iterable[_Union[StageTime, _Mapping]]] = ..., client_wait_s: _Optional[float] = ..., stream_ends: _Optional[_Mapping[str, int]] = ..., streams_opened: _Optional[int] = ..., audited_groups: _Optional[int] = ..., audit_mismatches: _Optional[int] = ..., backend_failed_groups: _Optional[int] = ..., backend_groups: _Optional[int] = ...) -> None: ...
