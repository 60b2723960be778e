"""TDEN configuration."""

from huggingface_hub.dataclasses import strict

from ..configuration_text import RegionBertConfig

__all__ = ["TdenConfig"]


@strict
class TdenConfig(RegionBertConfig):
    r"""Configuration of a TDEN model (Li et al., "Scheduled Sampling in Vision-Language Pretraining with Decoupled
    Encoder-Decoder Network", AAAI 2021), as released in X-modaler.

    TDEN is two-stream: a *sentence encoder* (BERT layers over the text, run bidirectionally for understanding and
    causally for generation), an *object encoder* (BERT layers over the regions), then a *cross-modal encoder*
    (shared attention over [visual | text], one feed-forward per modality) for understanding and a *decoder*
    (causal self-attention + cross-attention to the visual tokens) for generation. The defaults are TDEN-base.

    Args:
        num_hidden_layers (`int`, defaults to 12): sentence-encoder layers (X-modaler `NUM_HIDDEN_LAYERS`).
        num_visual_layers (`int`, defaults to 6): object-encoder layers (`V_NUM_HIDDEN_LAYERS`).
        num_cross_encoder_layers (`int`, defaults to 6): cross-modal encoder layers (`NUM_UNDERSTANDING_LAYERS`;
            0 for the captioner and retrieval).
        num_decoder_layers (`int`, defaults to 6): decoder layers (`NUM_GENERATION_LAYERS`; 0 for retrieval/VCR).
        type_vocab_size (`int`, defaults to 3): token types; understanding tokens are type
            `understanding_token_type_id` (0), generation tokens `generation_token_type_id` (1).
        layer_norm_eps (`float`, defaults to 1e-12): LayerNorm eps inside the BERT blocks and head transforms.
        embedding_layer_norm_eps (`float`, defaults to 1e-5): LayerNorm eps of the text and region embeddings (plain
            `nn.LayerNorm` in the original) and of the answer heads' LayerNorm.
        region_feature_dim (`int`, defaults to 2048), region_location_dim (`int`, defaults to 5): region inputs;
            the location is `[x1/W, y1/H, x2/W, y2/H, area/(W*H)]`.
        num_region_labels (`int`, defaults to 1601): detector classes of masked object classification.
        similarity_pooler_size (`int`, defaults to 1024), similarity_pooler_batchnorm (`bool`, defaults to True):
            the attention poolers of image-sentence matching / retrieval.
        classifier_pooler_size (`int`, defaults to 768), classifier_pooler_batchnorm (`bool`, defaults to False):
            the attention poolers of the VQA / VCR heads (VCR used 1024).
        pooler_dropout (`float`, defaults to 0.1): dropout inside the attention poolers' scoring MLP.
        decoder_attends_fused_visual (`bool`, defaults to True): when the cross-modal encoder runs (pre-training,
            VQA) the decoder cross-attends to its last *visual* output, as the released code does (the paper's
            figure shows the object encoder's output; `False` gives that).
        bidirectional_decoder (`bool`, defaults to False): without generation tokens, run the decoder
            bidirectionally over the understanding stream's sentence-encoder output (X-modaler's VQA/VCR model).
        ranking_margin (`float`, defaults to 0.2): margin of the hardest-negative triplet loss (ISM / retrieval).
        label_smoothing (`float`, defaults to 0.0): label smoothing of the captioning loss (the original XE
            fine-tuning used 0.1).
    """

    model_type = "tden"

    # BERT's text fields, region_feature_dim, num_region_labels: RegionBertConfig (these three change its defaults)
    type_vocab_size: int = 3
    use_cache: bool = True
    tie_word_embeddings: bool = False
    num_visual_layers: int = 6
    num_cross_encoder_layers: int = 6
    num_decoder_layers: int = 6
    embedding_layer_norm_eps: float = 1e-5
    understanding_token_type_id: int = 0
    generation_token_type_id: int = 1
    region_location_dim: int = 5
    similarity_pooler_size: int = 1024
    similarity_pooler_batchnorm: bool = True
    classifier_pooler_size: int = 768
    classifier_pooler_batchnorm: bool = False
    pooler_dropout: float | int = 0.1
    decoder_attends_fused_visual: bool = True
    bidirectional_decoder: bool = False
    ranking_margin: float | int = 0.2
    label_smoothing: float | int = 0.0
    bos_token_id: int | None = 101
    eos_token_id: int | None = 102

    def validate_architecture(self) -> None:
        super().validate_architecture()  # BertTextConfig: hidden_size / num_attention_heads
        for name in ("num_hidden_layers", "num_visual_layers", "num_cross_encoder_layers", "num_decoder_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.num_visual_layers < 1:
            raise ValueError("TDEN needs at least one object-encoder layer (num_visual_layers >= 1)")
        for name in ("understanding_token_type_id", "generation_token_type_id"):
            if not 0 <= getattr(self, name) < self.type_vocab_size:
                raise ValueError(
                    f"{name}={getattr(self, name)} is outside the type vocabulary ({self.type_vocab_size})"
                )
