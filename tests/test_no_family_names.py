"""No file of the core (iron_spec/, runtime/, operators/) names a model family in code.

A family lives only in its YAML (STYLE.md: core code names behaviours, never families). This
test reads every Python, C and JSON file of the three packages and collects what is code: the
identifiers, the string literals that are not docstrings, and (JSON) the keys and the string
values other than descriptions; comments and docstrings may cite transformers' classes, as the
brief asks them to. Each identifier or literal is split into lowercase words (at ``_``, ``-``,
``.``, spaces, and camelCase humps: ``GPTNeoXLayer`` -> ``gpt neo x layer``); a family is named
where its own words appear in a row, a trailing version number allowed (``llama3`` names
``llama``; ``gpt_neox`` is ``gpt neox``).

The names are every ``model_type`` of transformers 5.24's ``CONFIG_MAPPING_NAMES``
(lowercased, ``-`` as ``_``), committed here because CI has no transformers. A name that is
also an ordinary word of the code (``ALLOWED_WORDS``), or a literal that uses one as the name of
something else (``ALLOWED_LITERALS``), is allowed with its reason written beside it.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("iron_spec", "runtime", "operators")

# transformers 5.24: sorted(CONFIG_MAPPING_NAMES), lowercased, "-" -> "_".
MODEL_TYPES = """
    afmoe aimv2 aimv2_text_model aimv2_vision_model albert align align_text_model
    align_vision_model altclip altclip_text_model altclip_vision_model apertus apertus1p5
    apertus1p5_text apertus1p5_vision_tokenizer arcee aria aria_text
    audio_spectrogram_transformer audioflamingo3 audioflamingo3_encoder autoformer axk1 axk2
    aya_vision bailing_hybrid bamba bark bart beam beit bert bert_generation big_bird
    bigbird_pegasus biogpt bit bitnet blenderbot blenderbot_small blip blip_2 blip_2_qformer
    blip_2_vision_model blip_text_model blip_vision_model bloom blt blt_global_transformer
    blt_local_decoder blt_local_encoder blt_patcher bridgetower bridgetower_text_model
    bridgetower_vision_model bros camembert canary canary_decoder canine chameleon
    chameleon_vqgan chinese_clip chinese_clip_text_model chinese_clip_vision_model chmv2 clap
    clap_audio_model clap_text_model clip clip_text_model clip_vision_model clipseg
    clipseg_text_model clipseg_vision_model clvp clvp_decoder clvp_encoder codegen cohere
    cohere2 cohere2_moe cohere2_vision cohere_asr cohere_compass cohere_compass_text
    cohere_compass_vision colmodernvbert colpali colqwen2 conditional_detr convbert convnext
    convnextv2 cosmos3_edge cosmos3_edge_text cosmos3_edge_vision cosmos3_omni cpmant csm
    csm_depth_decoder_model ctrl cvt cwm d_fine dab_detr dac data2vec_audio data2vec_text
    data2vec_vision dbrx deberta deberta_v2 decision_transformer deepseek_ocr2
    deepseek_ocr2_encoder deepseek_ocr2_sam_vision_model deepseek_ocr2_text deepseek_ocr2_vision
    deepseek_v2 deepseek_v3 deepseek_v32 deepseek_v4 deepseek_vl deepseek_vl_hybrid
    deformable_detr deimv2 deit depth_anything depth_pro detr dia dia_decoder dia_encoder
    diffllama diffusion_gemma diffusion_gemma_text dinat dinov2 dinov2_with_registers
    dinov3_convnext dinov3_vit distilbert doge donut_swin dory dots1 dots3_note
    dots3_note_audio_encoder dots3_note_text dots3_note_vision_encoder dpr dpt edgetam
    edgetam_mask_decoder edgetam_prompt_encoder edgetam_video edgetam_video_mask_decoder
    edgetam_video_prompt_encoder edgetam_vision_model efficientloftr efficientnet electra
    embedding_gemma2 embedding_gemma2_text emu3 emu3_text_model emu3_vqgan encodec
    encoder_decoder eomt eomt_dinov3 ernie ernie4_5 ernie4_5_moe ernie4_5_vl_moe
    ernie4_5_vl_moe_text ernie4_5_vl_moe_vision esm esmc esmfold2 eurobert evolla evollamodel
    exaone exaone4 exaone4_5 exaone4_5_vision exaone_moe falcon falcon_h1 falcon_mamba fast_vlm
    fastspeech2_conformer fastspeech2_conformer_hifigan fastspeech2_conformer_with_hifigan
    flaubert flava flava_image_codebook flava_image_model flava_multimodal_model
    flava_text_model flex_olmo flint florence2 florence_vision fnet focalnet fsmt fun_asr_nano
    fun_asr_nano_encoder funnel fuyu gemma gemma2 gemma3 gemma3_text gemma3n gemma3n_audio
    gemma3n_text gemma3n_vision gemma4 gemma4_assistant gemma4_audio gemma4_text gemma4_unified
    gemma4_unified_assistant gemma4_unified_audio gemma4_unified_text gemma4_unified_vision
    gemma4_vision git git_vision_model glm glm4 glm46v glm4_moe glm4_moe_lite glm4v glm4v_moe
    glm4v_moe_text glm4v_moe_vision glm4v_text glm4v_vision glm5_next glm5_next_text
    glm5_next_vision glm_image glm_image_text glm_image_vision glm_image_vqmodel glm_moe_dsa
    glm_ocr glm_ocr_text glm_ocr_vision glmasr glmasr_encoder glmga glpn got_ocr2
    got_ocr2_vision gpt2 gpt_bigcode gpt_neo gpt_neox gpt_neox_japanese gpt_oss gpt_sw3 gptj
    gradium_phonon_tts granite granite4_vision granite4_vision_text granite_docling
    granite_docling_text granite_docling_vision granite_speech granite_speech5_ctc
    granite_speech5_encoder granite_speech_encoder granite_speech_plus
    granite_speech_plus_encoder granite_swa granitemoe granitemoe_swa granitemoehybrid
    granitemoeshared grounding_dino groupvit groupvit_text_model groupvit_vision_model gte
    helium hgnet_v2 hiera higgs_audio_v2 higgs_audio_v2_tokenizer hrm_text hubert
    hunyuan_v1_dense hunyuan_v1_moe hunyuan_vl hunyuan_vl_text hunyuan_vl_vision hy_v3 hy_v4
    hy_v4_vl hy_v4_vl_text hy_v4_vl_vision hyperclovax hyperclovax_vision_v2 ibert idefics
    idefics2 idefics2_perceiver idefics2_vision idefics3 idefics3_vision idefics_perciever
    idefics_vision ijepa imagegpt informer inkling2 inkling2_loop inkling2_loop_text
    inkling2_text inkling2_vision inkling_audio inkling_mm_model inkling_text inkling_vision
    instructblip instructblip_qformer instructblip_vision_model instructblipvideo
    instructblipvideo_qformer instructblipvideo_vision_model internlm3 internvl internvl_vision
    iquestcoder jais2 jamba janus janus_vision_model janus_vqgan jetmoe jev jina_embeddings_v3
    kimi_k25 kimi_k25_vision kimi_linear kolibri1 kosmos_2 kosmos_2.5 kosmos_2_5_text_model
    kosmos_2_5_vision_model kosmos_2_text_model kosmos_2_vision_model kyutai_speech_to_text
    laguna lara_mini lasr_ctc lasr_encoder layoutlm layoutlmv2 layoutlmv3 layoutxlm led levit
    lfm2 lfm2_moe lfm2_vl lfm3 lfm3_vl lfm3_vl_vision lightglue lighton_ocr lilt llama llama4
    llama4_text llama4_vision_model llava llava_next llava_next_video llava_onevision
    longcat_flash longformer longt5 luke lw_detr lw_detr_vit lxmert m2m_100 mamba mamba2 marian
    markuplm mask2former maskformer maskformer_swin mbart megatron_bert mellum metaclip_2
    metaclip_2_text_model metaclip_2_vision_model mgp_str mimi mimi_decoder mimi_encoder
    mimo_v2_flash minicpm3 minicpm_ocr minicpm_ocr_vision minicpmv4_6 minicpmv4_6_vision
    minicpmv4_7 minicpmv4_7_vision minimax minimax_m2 minimax_m3_vl minimax_m3_vl_text
    minimax_m3_vl_vision ministral ministral3 mistral mistral3 mistral4 mistral_large4
    mistral_large4_text mixtral mlcd mlcd_vision_model mllama mllama_text_model
    mllama_vision_model mm_grounding_dino mobilebert mobilenet_v1 mobilenet_v2 mobilevit
    mobilevitv2 modernbert modernbert_decoder modernvbert molmo2 molmo2_adapter molmo2_text
    molmo2_vision moonshine moonshine_streaming moonshine_streaming_encoder moshi moshi_depth
    moss_transcribe_diarize moss_transcribe_diarize_audio mpnet mpt mra mt5 muse_glimmer
    muse_glimmer_assistant muse_glimmer_text muse_glimmer_vision muse_spark muse_spark_audio
    muse_spark_text muse_spark_vision musicflamingo musicgen musicgen_decoder musicgen_melody
    musicgen_melody_decoder mvp nanochat nemo_speechlm nemotron nemotron3_5_asr
    nemotron3_5_transcribe_asr_audio nemotron3_5_transcribe_audio
    nemotron3_5_transcribe_word_timestamp nemotron3_diarization nemotron3_diarization_audio
    nemotron_asr_streaming nemotron_asr_streaming_encoder nemotron_h nemotron_h_omni neomme
    neucodec nllb_moe nomic_bert nougat nystromformer olmo olmo2 olmo3 olmo_hybrid olmoe
    omdet_turbo omniasr omniasr_audio omniasr_ctc oneformer openai_gpt openai_privacy_filter opt
    ovis2 ovis2_vision owlv2 owlv2_text_model owlv2_vision_model owlvit owlvit_text_model
    owlvit_vision_model paddleocr_vl paddleocr_vl_text paddleocr_vl_vision paligemma
    parakeet_ctc parakeet_encoder parakeet_rnnt parakeet_tdt patchtsmixer patchtst pe_audio
    pe_audio_encoder pe_audio_video pe_audio_video_encoder pe_video pe_video_encoder pegasus
    pegasus_x perceiver perception_lm persimmon phi phi3 phi4_multimodal phi4_multimodal_audio
    phi4_multimodal_vision phimoe pi0 pix2struct pix2struct_text_model pix2struct_vision_model
    pixio pixtral plbart pocket_tts pocket_tts_audio_tokenizer
    pocket_tts_audio_tokenizer_decoder pocket_tts_audio_tokenizer_encoder poolformer pop2piano
    pp_chart2table pp_chart2table_vision pp_doclayout_v2 pp_doclayout_v3 pp_doclayout_v4
    pp_formulanet pp_formulanet_text pp_formulanet_vision pp_lcnet pp_lcnet_v3 pp_lcnet_v4
    pp_ocrv5_mobile_det pp_ocrv5_mobile_rec pp_ocrv5_server_det pp_ocrv5_server_rec
    pp_ocrv6_medium_det pp_ocrv6_small_det pp_ocrv6_small_rec pp_ocrv6_tiny_rec
    prompt_depth_anything prophetnet pvt pvt_v2 qianfan_ocr qianfan_ocr_vision qwen2
    qwen2_5_omni qwen2_5_omni_audio_encoder qwen2_5_omni_bigvgan qwen2_5_omni_dit
    qwen2_5_omni_talker qwen2_5_omni_text qwen2_5_omni_thinker qwen2_5_omni_token2wav
    qwen2_5_omni_vision_encoder qwen2_5_vl qwen2_5_vl_text qwen2_5_vl_vision qwen2_audio
    qwen2_audio_encoder qwen2_moe qwen2_vl qwen2_vl_text qwen2_vl_vision qwen3 qwen3_5
    qwen3_5_moe qwen3_5_moe_text qwen3_5_moe_vision qwen3_5_text qwen3_5_vision qwen3_asr
    qwen3_asr_encoder qwen3_moe qwen3_next qwen3_omni_moe qwen3_omni_moe_audio_encoder
    qwen3_omni_moe_talker_code_predictor qwen3_omni_moe_talker_text qwen3_omni_moe_text
    qwen3_omni_moe_thinker qwen3_omni_moe_vision_encoder qwen3_vl qwen3_vl_moe qwen3_vl_moe_text
    qwen3_vl_moe_vision qwen3_vl_text qwen3_vl_vision qwen4_exp qwen4_exp_text qwen4_exp_vision
    radio rag recurrent_gemma reformer regnet rembert resnet rf_detr rf_detr_dinov2 roberta
    roberta_prelayernorm roc_bert roformer rt_detr rt_detr_resnet rt_detr_v2 rwkv sam sam2
    sam2_hiera_det_model sam2_mask_decoder sam2_prompt_encoder sam2_video
    sam2_video_mask_decoder sam2_video_prompt_encoder sam2_vision_model sam3 sam3_detr_decoder
    sam3_detr_encoder sam3_geometry_encoder sam3_lite_text sam3_lite_text_detr_decoder
    sam3_lite_text_detr_encoder sam3_lite_text_geometry_encoder sam3_lite_text_mask_decoder
    sam3_lite_text_text_model sam3_mask_decoder sam3_tracker sam3_tracker_mask_decoder
    sam3_tracker_prompt_encoder sam3_tracker_video sam3_tracker_video_mask_decoder
    sam3_tracker_video_prompt_encoder sam3_video sam3_vision_model sam3_vit_model sam_hq
    sam_hq_mask_decoder sam_hq_prompt_encoder sam_hq_vision_model sam_mask_decoder
    sam_prompt_encoder sam_vision_model sapiens2 sapiens2_head sarvam_mla sarvam_moe
    seamless_m4t seamless_m4t_v2 seed_oss segformer seggpt sew sew_d shieldgemma2 siglip siglip2
    siglip2_text_model siglip2_vision_model siglip_text_model siglip_vision_model slanet slanext
    slanext_vision smollm3 smolvlm smolvlm_vision solar_open speech_encoder_decoder
    speech_to_text speecht5 speecht5_hifigan splinter squeezebert stablelm starcoder2 step3p5
    step3p5_vision step3p7 superglue superpoint swiftformer swin swin2sr swinv2
    switch_transformers t5 t5_gemma_module t5gemma t5gemma2 t5gemma2_decoder t5gemma2_encoder
    t5gemma2_text table_transformer tapas textnet time_series_transformer timesfm timesfm2_5
    timesformer timm_backbone timm_wrapper tipsv2 tipsv2_dpt tipsv2_text_model
    tipsv2_vision_model trocr tvp udop ultrabert ultravbert umt5 unispeech unispeech_sat univnet
    unlimited_ocr unlimited_ocr_sam_vision_model unlimited_ocr_text unlimited_ocr_vision
    unlimited_ocr_vision_encoder upernet uvdoc uvdoc_backbone vaultgemma vibevoice
    vibevoice_acoustic_tokenizer vibevoice_acoustic_tokenizer_decoder
    vibevoice_acoustic_tokenizer_encoder vibevoice_asr vibevoice_diffusion video_llama_3
    video_llama_3_vision video_llava videomae videomt videoprism videoprism_text_model
    videoprism_vision_model vilt vipllava vision_encoder_decoder vision_text_dual_encoder
    visual_bert vit vit_mae vit_msn vitdet vitmatte vitpose vitpose_backbone vits vivit vjepa2
    voxtral voxtral_encoder voxtral_realtime voxtral_realtime_encoder voxtral_realtime_text
    wav2vec2 wav2vec2_bert wav2vec2_conformer wavlm wavtokenizer wavtokenizer_encoder whisper
    xclip xclip_text_model xclip_vision_model xcodec xcodec2 xglm xlm xlm_roberta xlm_roberta_xl
    xlnet xlstm xmod yolos yoso youtu zamba zamba2 zaya zoedepth
""".split()

# Model types that are also plain words of this code base, each with its reason.
ALLOWED_WORDS: dict[str, str] = {
    "align": "memory alignment (the arena's ALIGN), not the ALIGN vision-text model",
    "bit": "int.bit_length and bit widths, not the BiT vision model",
    "clip": "clamping (numpy's clip, attention.clip_qkv), not the CLIP vision-text model",
    "opt": "short for option (the interpreter's opt() reader), not the OPT family",
}

# Whole literals that hold a model type's name as the name of something else, with the reason.
ALLOWED_LITERALS: dict[str, str] = {
    "llama3": "a RoPE scaling type: transformers' rope_type 'llama3' (ROPE_INIT_FUNCTIONS), a "
              "config value the rope operator reads, not a family switch",
    "sentence_bert_config.json": "sentence-transformers' file of max_seq_length, a file format's name",
    "gpt2": "a GGUF file's tokenizer.ggml.model value naming byte-level BPE (llama.cpp's word for "
            "the tokenizer kind, whatever the family), read by runtime/gguf_vocab.py",
    "llama": "a GGUF file's tokenizer.ggml.model value naming a SentencePiece vocabulary "
             "(llama.cpp's word for the tokenizer kind, whatever the family)",
    # bench's GGUF peer (iron_spec/bench.py ENGINE...): an inference engine and its Python
    # binding, named after the family but serving every GGUF model.
    "llama.cpp": "the name of the inference engine bench runs beside us, not the Llama family",
    "llama_cpp": "the Python module of that engine (llama-cpp-python), and its ratios' key",
    "llama-cpp-python": "the package of that engine's Python binding (the peer extra)",
    "Llama": "the engine's model class (llama_cpp.Llama), which loads any GGUF",
    "bert": "a GGUF file's tokenizer.ggml.model value naming a WordPiece vocabulary (llama.cpp's "
            "word for the tokenizer kind), read by runtime/gguf_vocab.py",
    "BertNormalizer": "the tokenizers library's WordPiece normalizer class (any WordPiece "
                      "vocabulary's), which runtime/gguf_vocab.py builds",
    "BertPreTokenizer": "the tokenizers library's WordPiece pre-tokenizer class",
}
# GGUF's tokenizer.ggml.pre values: llama.cpp's names of its text-splitting rules
# (llama-vocab.cpp), many named after the model that first used the rule, and read whatever
# the file's family (a llama file may split as "qwen2"). runtime/gguf_vocab.py's table of them
# is a file format's vocabulary, as the tokenizer.ggml.model values above are.
from iron_spec.runtime.gguf_vocab import PRE_TOKENIZERS  # noqa: E402

ALLOWED_LITERALS.update({name: "a GGUF file's tokenizer.ggml.pre value (llama.cpp's name of a "
                               "text-splitting rule), not a family switch"
                         for name in PRE_TOKENIZERS})


def _words(text: str) -> list[str]:
    """Lowercase words of an identifier or literal: split at non-alphanumerics and camelCase."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", " ", text)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def _families() -> dict[tuple[str, ...], str]:
    """Each model type's words -> the model type, less the allowed words."""
    return {tuple(w for w in re.split(r"[^a-z0-9]+", n) if w): n for n in MODEL_TYPES
            if n not in ALLOWED_WORDS}


def _named(words: list[str], families: dict[tuple[str, ...], str]) -> set[str]:
    """The families whose words occur in a row in ``words`` (the last may carry digits)."""
    longest = max(map(len, families))
    hits = set()
    for i in range(len(words)):
        for k in range(1, min(longest, len(words) - i) + 1):
            window = words[i:i + k]
            for last in {window[-1], window[-1].rstrip("0123456789")}:
                name = families.get(tuple(window[:-1]) + (last,))
                if name:
                    hits.add(name)
    return hits


def _python_code(source: str) -> list[tuple[int, str]]:
    """(line, text) of every identifier and non-docstring string literal."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                docstrings.add(id(body[0].value))
    out = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name):
            out.append((line, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((line, node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((line, node.name))
        elif isinstance(node, ast.arg):
            out.append((line, node.arg))
        elif isinstance(node, ast.keyword) and node.arg:
            out.append((line, node.arg))
        elif isinstance(node, ast.alias):
            out.append((line, node.asname or node.name))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append((line, node.value))
    return out


_C_TOKEN = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\])*"|[A-Za-z_][A-Za-z0-9_]*', re.S)


def _c_code(source: str) -> list[tuple[int, str]]:
    """(line, text) of every identifier and string literal outside comments."""
    out = []
    for m in _C_TOKEN.finditer(source):
        tok = m.group(0)
        if tok.startswith(("/*", "//")):
            continue
        out.append((source.count("\n", 0, m.start()) + 1, tok))
    return out


def _json_code(source: str) -> list[tuple[int, str]]:
    """Every key, and every string value not under a description or title key."""
    out = []

    def walk(node, key=None):
        if isinstance(node, dict):
            for k, v in node.items():
                out.append((0, k))
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif isinstance(node, str) and key not in ("description", "title", "$comment"):
            out.append((0, node))

    walk(json.loads(source))
    return out


READERS = {".py": _python_code, ".c": _c_code, ".json": _json_code}

# Files that record transformers rather than choose behaviour: a model type there is a key of
# transformers' own table, read by type, never a branch of the core's code.
RECORDS = {
    "iron_spec/spec/keys.json": "the config keys each transformers model type reads, written by "
                                "python -m tests.goldens.keys and looked up by model_type",
}


def _files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*")
                  if p.suffix in READERS and "__pycache__" not in p.parts
                  and p.relative_to(ROOT).as_posix() not in RECORDS)


def test_the_scan_sees_the_core():
    files = _files()
    assert {p.relative_to(ROOT).parts[0] for p in files} == set(PACKAGES)
    assert any(p.suffix == ".c" for p in files) and any(p.suffix == ".json" for p in files)


@pytest.mark.parametrize("text, named", [
    ("Qwen3Attention", {"qwen3"}), ("GPTNeoXLayer", set()), ("gpt_neox_rows", {"gpt_neox"}),
    ("if family == 'llama3'", {"llama"}), ("rotate_every_two", set()), ("layernorm", set()),
    ("gemma_plus_one", {"gemma"}), ("plus_one", set()),
])
def test_words_find_a_family_where_it_is_written(text, named):
    assert _named(_words(text), _families()) & {"qwen3", "gpt_neox", "llama", "gemma"} == named


def test_records_exist():
    assert all((ROOT / path).is_file() for path in RECORDS), RECORDS


def test_allowances_are_model_types_and_in_use():
    assert set(ALLOWED_WORDS) <= set(MODEL_TYPES), sorted(set(ALLOWED_WORDS) - set(MODEL_TYPES))
    literals = {text for p in _files() for _, text in READERS[p.suffix](p.read_text(encoding="utf-8"))}
    assert set(ALLOWED_LITERALS) <= literals, sorted(set(ALLOWED_LITERALS) - literals)


def test_no_core_file_names_a_family():
    families = _families()
    found = []
    for path in _files():
        for line, text in READERS[path.suffix](path.read_text(encoding="utf-8")):
            if text in ALLOWED_LITERALS:
                continue
            for name in sorted(_named(_words(text), families)):
                found.append(f"{path.relative_to(ROOT)}:{line}: {name!r} in {text[:60]!r}")
    assert not found, "family names in core code:\n" + "\n".join(found)
