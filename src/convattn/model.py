"""The encoder and its task heads, as HuggingFace models; their layers are layers.py's, their losses losses.py's,
and the padding-free route padding_free.py's.

Weight names follow HuggingFace BERT/ConvBERT (`embeddings.*`, `embeddings_project`,
`encoder.layer.{i}.attention.self.*`, `attention.output.{dense,LayerNorm}`, `intermediate.dense`,
`output.{dense,LayerNorm}`), so checkpoints map across with renames only at the top level.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils.generic import can_return_tuple

from convattn.attention import TokenMask, attention_kind
from convattn.attention.core import is_tracing
from convattn.config import ConvAttnConfig, check_attn_implementation
from convattn.files import follow_umask
from convattn.flattened_inputs import flattened_sequences
from convattn.layers import ConvAttnEmbeddings, ConvAttnEncoder
from convattn.losses import (
    check_sequence_labels,
    check_something_masked,
    check_token_labels,
    masked_lm_loss,
    sequence_classification_loss,
    span_loss,
    token_classification_loss,
)
from convattn.padding_free import flattened, positions_in_sequences, unpadded, worth_unpadding
from convattn.qa import BEAM, JointQuestionAnsweringOutput, JointSpanHead, answer, default_answer_mask


class ConvAttnPreTrainedModel(PreTrainedModel):
    config_class = ConvAttnConfig
    config: ConvAttnConfig
    base_model_prefix = "convattn"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flex_attn = True  # relative terms as a FlexAttention score_mod
    # the heads' **sequence_offsets are a flattened batch's offsets, not loss kwargs: the Trainer must not pass
    # num_items_in_batch (it would read any ** in forward as accepting them)
    accepts_loss_kwargs = False
    # a pretraining head in the folder (the MLM head, ELECTRA's generator and heads) that the model loaded has not
    # (the encoder, a task head) is left out as intended: not a load-report table on every fine-tuning. A task head
    # or encoder weights that do not fit are still reported (and refused by checkpoint.load_checked)
    _keys_to_ignore_on_load_unexpected = [r"^(mlm_head|discriminator_head|generator_head|generator)\."]  # noqa: RUF012

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        """Every attention module reads `config._attn_implementation` at each forward, so
        `set_attn_implementation` switches a built model (transformers' own check would read this file's source
        for its AttentionInterface, which convattn's mechanisms do not use)."""
        return True

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        """convattn's names, each checked where it is chosen (from_pretrained, set_attn_implementation): an unknown
        one is named with those that exist, a kernel that cannot run here says what to install or set."""
        if requested_attention is not None:
            check_attn_implementation(requested_attention)
        return super().get_correct_attn_implementation(requested_attention, is_init_check)

    def save_pretrained(self, save_directory, *args, **kwargs):
        super().save_pretrained(save_directory, *args, **kwargs)
        for weights in Path(save_directory).glob("*.safetensors"):
            follow_umask(weights)  # safetensors writes its files readable by their owner alone

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """BERT's init (normal(0, 0.02), zero biases, unit LayerNorm); modules with their own
        scheme (the paper codes' default-initialised convolutions, relative tables) define
        `init_weights(std)`."""
        std = self.config.initializer_range
        if hasattr(module, "init_weights") and not isinstance(module, PreTrainedModel):
            module.init_weights(std)
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, MaskedLMHead):
            init.zeros_(module.bias)


def check_in_table(name: str, ids: Tensor | None, size: int, field: str) -> None:
    """Ids that index an embedding table lie inside it (outside, the CPU's lookup is a bare IndexError). Checked on
    CPU only: on a GPU reading the range would wait for the device twice a forward (there a bad id is a device
    assert)."""
    if ids is None or ids.numel() == 0 or ids.device.type != "cpu":
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= size:
        bad = low if low < 0 else high
        raise ValueError(f"{name} holds {bad}, outside the model's {size} rows ({field}={size}): give ids in "
                         f"0..{size - 1} (tokenized for this model; a single segment has token type 0, a pair 0 and 1)")


class ConvAttnModel(ConvAttnPreTrainedModel):
    """The bare encoder: embeddings -> [Linear(E -> H) if E != H] -> L layers.

    Three layouts of a batch: padded (batch, n) with an attention_mask; flattened (1, total) with position_ids
    restarting at every sequence (transformers' `DataCollatorWithFlattening`; `flattened_sequences`), each
    sequence computed as if alone; and, in training, a padded batch with enough padding, which runs padding-free
    inside (`unpadded`) and comes back padded. Linformer's projections need the padded length: it takes padded batches
    only."""

    def __init__(self, config: ConvAttnConfig):
        super().__init__(config)
        self.embeddings = ConvAttnEmbeddings(config)
        if config.embedding_size != config.hidden_size:
            self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size)
        self.encoder = ConvAttnEncoder(config)
        # whether a padded batch with enough padding runs padding-free inside (`unpadding_keeps_outputs`)
        self.runs_padding_free = True
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    @property
    def takes_packed_sequences(self) -> bool:
        """Whether every layer computes packed sequences one by one (all but Linformer's)."""
        return all(attention_kind(self.config, i) != "linformer" for i in range(self.config.num_hidden_layers))

    def embed(self, input_ids, token_type_ids, position_ids, inputs_embeds) -> Tensor:
        hidden = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        if hasattr(self, "embeddings_project"):
            hidden = self.embeddings_project(hidden)
        return hidden

    @property
    def max_position(self) -> int | None:
        """The positions absolute position embeddings hold; None for models without them."""
        if self.config.position_embedding_type == "absolute":
            return self.config.max_position_embeddings
        return None

    def check_positions(self, longest: int) -> None:
        # only absolute position embeddings tie a model to its trained length (Linformer's E/F check their own)
        if self.config.position_embedding_type == "absolute" and longest > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {longest} exceeds max_position_embeddings={self.config.max_position_embeddings} "
                "of this model's absolute position embeddings; truncate the input or build the model with a larger "
                "max_position_embeddings"
            )

    @can_return_tuple
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        cu_seq_lens_q: Tensor | None = None,
        cu_seq_lens_k: Tensor | None = None,
        max_length_q: int | None = None,
        max_length_k: int | None = None,
    ) -> BaseModelOutput:
        """cu_seq_lens_q / max_length_q (and their _k twins, which must equal them): the sequence offsets of a
        flattened batch as `DataCollatorWithFlattening(return_flash_attn_kwargs=True)` gives them; position_ids
        restarting at 0 say the same. `flattened_sequences` reads and checks them, with position_ids,
        token_type_ids and attention_mask (its docstring has the rule)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        batch, n = input_ids.shape if input_ids is not None else inputs_embeds.shape[:2]
        device = input_ids.device if input_ids is not None else inputs_embeds.device
        if n == 0:
            raise ValueError(f"the batch holds no tokens (inputs of shape ({batch}, 0)): an empty flattened row or "
                             "only empty examples; give every batch at least one token")
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        packed = flattened_sequences(
            batch, n, device, position_ids, attention_mask, token_type_ids, cu_seq_lens_q, cu_seq_lens_k,
            max_length_q, max_length_k, max_position=self.max_position)
        if not is_tracing():
            check_in_table("input_ids", input_ids, self.config.vocab_size, "vocab_size")
            check_in_table("token_type_ids", token_type_ids, self.config.type_vocab_size, "type_vocab_size")
        if packed is not None:
            if not self.takes_packed_sequences:
                raise ValueError(
                    "Linformer layers project keys and values along a fixed sequence length and cannot take a "
                    "flattened batch (position_ids restarting inside one row, or cu_seq_lens_q); pass a padded batch "
                    "with an attention_mask")
            self.check_positions(packed.max_seqlen)
            if position_ids is None:
                position_ids = positions_in_sequences(packed, n, device)
            packed.positions = position_ids  # rotary positions read them
            hidden = self.embed(input_ids, token_type_ids, position_ids, inputs_embeds)
            return self.encoder(hidden, packed, output_attentions, output_hidden_states)
        self.check_positions(n)
        if attention_mask is None:
            keep = torch.ones(batch, n, dtype=torch.bool, device=device)
        else:
            keep = attention_mask.bool().expand(batch, n)
        if not output_attentions and worth_unpadding(self, keep):
            return unpadded(self, keep, input_ids, token_type_ids, position_ids, inputs_embeds, output_hidden_states)
        hidden = self.embed(input_ids, token_type_ids, position_ids, inputs_embeds)
        return self.encoder(hidden, TokenMask(keep, position_ids), output_attentions, output_hidden_states)


class MaskedLMHead(nn.Module):
    """Linear(H -> E) -> GELU -> LayerNorm(E) -> decoder tied to the word embeddings, own bias."""

    def __init__(self, config: ConvAttnConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.act = ACT2FN["gelu"]
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.decoder(self.LayerNorm(self.act(self.dense(hidden_states)))) + self.bias


def _encode(model: ConvAttnPreTrainedModel, input_ids, attention_mask, token_type_ids, position_ids,
            inputs_embeds, output_attentions, output_hidden_states, sequence_offsets: dict) -> BaseModelOutput:
    """sequence_offsets: a flattened batch's cu_seq_lens_q / max_length_q (and _k) kwargs, as the heads got them."""
    return model.convattn(
        input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
        position_ids=position_ids, inputs_embeds=inputs_embeds, output_attentions=output_attentions,
        output_hidden_states=output_hidden_states, **sequence_offsets,
    )


class ConvAttnForMaskedLM(ConvAttnPreTrainedModel):
    _tied_weights_keys = {"mlm_head.decoder.weight": "convattn.embeddings.word_embeddings.weight"}  # noqa: RUF012

    def __init__(self, config: ConvAttnConfig):
        super().__init__(config)
        self.convattn = ConvAttnModel(config)
        self.mlm_head = MaskedLMHead(config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.mlm_head.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.mlm_head.decoder = new_embeddings

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, return_logits: bool = True, **sequence_offsets) -> MaskedLMOutput:
        """return_logits=False (with labels): the loss alone, the decoder run only at the labelled positions
        instead of a (tokens x vocabulary) matmul whose result a training step never uses."""
        encoded = _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                          output_attentions, output_hidden_states, sequence_offsets)
        hidden = encoded.last_hidden_state
        if labels is not None:
            check_token_labels(labels, hidden.shape[:2])
            flattened = position_ids is not None or bool(sequence_offsets)
            if self.training and flattened and input_ids is not None and not torch.compiler.is_compiling():
                check_something_masked(labels, input_ids)
        # the HF contract by default: logits come with the loss, as BertForMaskedLM
        logits = self.mlm_head(hidden) if return_logits or labels is None else None
        loss = masked_lm_loss(self.mlm_head, hidden, labels) if labels is not None else None
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states,
                              attentions=encoded.attentions)


class ClassificationHead(nn.Module):
    """ELECTRA/ConvBERT sentence head on the first token: dropout -> dense -> GELU -> dropout -> out_proj."""

    def __init__(self, config: ConvAttnConfig):
        super().__init__()
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.dropout = nn.Dropout(dropout)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden_states: Tensor) -> Tensor:
        x = self.dropout(hidden_states[:, 0])
        return self.out_proj(self.dropout(self.act(self.dense(x))))


class ConvAttnForSequenceClassification(ConvAttnPreTrainedModel):
    """Classification, or regression (MSE) when num_labels == 1."""

    def __init__(self, config: ConvAttnConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.convattn = ConvAttnModel(config)
        self.classifier = ClassificationHead(config)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **sequence_offsets) -> SequenceClassifierOutput:
        encoded = _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                          output_attentions, output_hidden_states, sequence_offsets)
        hidden = encoded.last_hidden_state
        packed = flattened(self, hidden, position_ids, attention_mask, sequence_offsets)
        if packed is not None:
            hidden = hidden[0, packed.starts][:, None]  # a flattened batch: each sequence's first token
        logits = self.classifier(hidden)
        loss = None
        if labels is not None:
            multi_label = self.num_labels > 1 and self.config.problem_type == "multi_label_classification"
            check_sequence_labels(labels, logits, multi_label, flattened=packed is not None)
            loss = sequence_classification_loss(logits, labels, self.num_labels, multi_label)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states,
                                        attentions=encoded.attentions)


class ConvAttnForTokenClassification(ConvAttnPreTrainedModel):
    def __init__(self, config: ConvAttnConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.convattn = ConvAttnModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **sequence_offsets) -> TokenClassifierOutput:
        encoded = _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                          output_attentions, output_hidden_states, sequence_offsets)
        logits = self.classifier(self.dropout(encoded.last_hidden_state))
        loss = None
        if labels is not None:
            check_token_labels(labels, logits.shape[:2])
            loss = token_classification_loss(logits, labels)
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=encoded.hidden_states,
                                     attentions=encoded.attentions)


class ConvAttnForQuestionAnswering(ConvAttnPreTrainedModel):
    """Extractive QA. `config.qa_head` "span": start and end logits per token (BERT's head, transformers'
    ConvBERT's); "joint": ELECTRA's head (qa.py), which also takes `answer_mask`, for SQuAD 2.0 training
    `is_impossible`, and predicts with a `beam` of starts and ends (0: the end logits of the most likely start
    only, which an exported graph computes)."""

    def __init__(self, config: ConvAttnConfig):
        super().__init__(config)
        self.convattn = ConvAttnModel(config)
        self.convattn.runs_padding_free = False  # the span head's loss reads the pad positions' logits too
        if config.qa_head == "joint":
            self.qa_joint = JointSpanHead(config.hidden_size)
        else:
            self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, start_positions=None, end_positions=None, output_attentions=None,
                output_hidden_states=None, return_dict=None, answer_mask=None, is_impossible=None,
                beam=BEAM, **sequence_offsets) -> QuestionAnsweringModelOutput | JointQuestionAnsweringOutput:
        encoded = _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                          output_attentions, output_hidden_states, sequence_offsets)
        hidden = encoded.last_hidden_state
        if flattened(self, hidden, position_ids, attention_mask, sequence_offsets) is not None:
            raise ValueError("question answering takes padded batches (its answer positions count within each "
                             "window); a padded batch with padding runs padding-free inside anyway")
        if self.config.qa_head == "joint":
            if answer_mask is None:
                answer_mask = default_answer_mask(attention_mask, token_type_ids, hidden.shape[:2]).to(hidden.device)
            out = self.qa_joint(hidden, answer_mask.bool(), start_positions, end_positions, is_impossible, beam)
            out.hidden_states, out.attentions = encoded.hidden_states, encoded.attentions
            return out
        start_logits, end_logits = self.qa_outputs(hidden).unbind(dim=-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                            hidden_states=encoded.hidden_states, attentions=encoded.attentions)

    def answer(self, question: str, context: str, tokenizer=None, **options) -> dict:
        """The most likely answer to `question` in `context`: {"answer", "score", "start", "end"} (`qa.answer`);
        the tokenizer saved with the model unless one is given."""
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.name_or_path, trust_remote_code=True)  # as the model
        return answer(self, tokenizer, question, context, **options)
