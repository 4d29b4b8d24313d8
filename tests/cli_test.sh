#!/usr/bin/env bash
# The loom command on good and bad input: bad input gives ONE line on stderr
# naming the file and the reason, a non-zero exit, and no output file.
set -u
LOOM="$1"
DATA="$(cd "$(dirname "$0")" && pwd)/data"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0

pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; failures=$((failures + 1)); }

# expect_error NAME EXPECTED_SUBSTRING OUTPUT_THAT_MUST_NOT_EXIST -- command...
expect_error() {
  local name="$1" want="$2" out="$3"
  shift 4
  local err rc
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  if [ $rc -eq 0 ]; then fail "$name: exit code 0"; return; fi
  # Progress lines ("loading ...") may precede it; the error is exactly one "loom:" line.
  if [ "$(printf '%s\n' "$err" | grep -c '^loom: ')" -ne 1 ]; then fail "$name: not one error line: $err"; return; fi
  if [[ "$err" != *"$want"* ]]; then fail "$name: '$err' lacks '$want'"; return; fi
  if [ -n "$out" ] && [ -e "$out" ]; then fail "$name: left $out behind"; return; fi
  if ls "$WORK" | grep -q '\.tmp\.'; then fail "$name: left a temporary file"; return; fi
  pass "$name"
}

# loom export of a quantized folder writes its weights widened to bf16: the same tokens as the folder itself.
QFIX="$(dirname "$0")/data/quantized/gptq-g32-asym"
"$LOOM" export --model="$QFIX" --out="$WORK/widened" >/dev/null 2>&1 &&
  [ "$("$LOOM" run --model="$WORK/widened" --prompt=1,2,3 --tokens=4 2>/dev/null | grep '^tokens:')" = \
    "$("$LOOM" run --model="$QFIX" --prompt=1,2,3 --tokens=4 2>/dev/null | grep '^tokens:')" ] &&
  pass "export of a quantized folder" || fail "export of a quantized folder"
expect_error "quantize scheme" "--scheme=INT3: one of FP8, W4A16, W8A16" "$WORK/q_bad" -- \
  "$LOOM" quantize --model="$WORK/tiny_hf" --out="$WORK/q_bad" --scheme=INT3
expect_error "quantize group size" "--group_size is a W4A16 setting" "$WORK/q_bad" -- \
  "$LOOM" quantize --model="$WORK/tiny_hf" --out="$WORK/q_bad" --scheme=FP8 --group_size=64

# --- good paths -------------------------------------------------------------
"$LOOM" compile --model=random:tiny --num_sms=8 --out="$WORK/tiny.pb" >/dev/null && pass "compile tiny" || fail "compile tiny"
# The one-pass prefill of 20 rows, lowered, verified and written; inspect reads it back.
"$LOOM" compile --model=random:tiny --prefill_rows=20 --out="$WORK/pass.pb" | grep -q "compile + verify" &&
  "$LOOM" inspect "$WORK/pass.pb" | grep -q "prefill" && pass "compile --prefill_rows" || fail "compile --prefill_rows"
"$LOOM" compile --model=random:tiny --prefill_rows=20 --verify=false --repeat=2 --out="$WORK/pass2.pb" |
  grep -q "^lowering: median" && pass "compile --prefill_rows --verify=false" ||
  fail "compile --prefill_rows --verify=false"
expect_error "--verify=false without a pass" "--prefill_rows" "$WORK/nv.pb" -- \
  "$LOOM" compile --model=random:tiny --verify=false --out="$WORK/nv.pb"
expect_error "negative prefill rows" "--prefill_rows" "$WORK/neg.pb" -- \
  "$LOOM" compile --model=random:tiny --prefill_rows=-3 --out="$WORK/neg.pb"
"$LOOM" inspect "$WORK/tiny.pb" | grep -q "instructions per step" && pass "inspect" || fail "inspect"
"$LOOM" inspect "$WORK/tiny.pb" | grep -q "shared memory per SM: 11 pages of 16 KB (11 in flight), 46 KB activation ring in 1 slot" &&
  pass "inspect: shared memory" || fail "inspect: shared memory"
"$LOOM" compile --model=random:tiny --out="$WORK/tiny.pbtxt" --policy=lpt --granularity=op >/dev/null &&
  "$LOOM" inspect "$WORK/tiny.pbtxt" >/dev/null && pass "text-format schedule" || fail "text-format schedule"
"$LOOM" run --model=random:tiny --tokens=8 --prompt=5,6,7 --check 2>/dev/null | grep -q "identical to the op-by-op oracle" &&
  pass "run --check" || fail "run --check"
LONG=$(seq -s, 3 7 900)  # 129 tokens: two row tiles of the prefill pass
"$LOOM" run --model=random:tiny --tokens=6 --prompt="$LONG" --check 2>/dev/null | grep -q "identical to the op-by-op oracle" &&
  pass "run --check, prefill of 129 tokens" || fail "run --check, prefill of 129 tokens"
"$LOOM" run --model=random:tiny --tokens=6 --prompt="$LONG" --prefill=false --check 2>/dev/null |
  grep -q "ms/token over 134 steps" && pass "run --prefill=false" || fail "run --prefill=false"
"$LOOM" run --model=random:tiny-mistral --tokens=2 --prompt=5,6,7 2>&1 | grep -q "note: no prefill pass (prefill: op.*head_dim 32" &&
  pass "prefill refusal noted" || fail "prefill refusal noted"
"$LOOM" export --model=random:tiny --out="$WORK/tiny_hf" >/dev/null &&
  "$LOOM" run --model="$WORK/tiny_hf" --tokens=4 2>/dev/null | grep -q "^tokens:" && pass "export + run folder" ||
  fail "export + run folder"
# loom quantize: a compressed-tensors folder that loads back and runs identical to the oracle (on its weights).
for scheme in FP8 W4A16; do
  "$LOOM" quantize --model="$WORK/tiny_hf" --out="$WORK/q_$scheme" --scheme=$scheme >/dev/null 2>&1 &&
    "$LOOM" run --model="$WORK/q_$scheme" --prompt=1,2,3 --tokens=4 --check 2>/dev/null |
    grep -q "identical to the op-by-op oracle" && pass "quantize $scheme + run --check" ||
    fail "quantize $scheme + run --check"
done
# A bf16 KV cache: the run agrees with the oracle over the same bf16 caches; a KV dtype that is neither is refused,
# and so is bf16 for a model without a KV cache.
"$LOOM" run --model="$WORK/tiny_hf" --prompt=1,2,3,4,5,6,7,8,9,10 --tokens=8 --kv_dtype=bf16 --check 2>/dev/null |
  grep -q "identical to the op-by-op oracle" && pass "run --kv_dtype=bf16 --check" || fail "run --kv_dtype=bf16 --check"
expect_error "kv_dtype" "kv_dtype 'f16': f32 or bf16" "" -- "$LOOM" run --model=random:tiny --tokens=2 --kv_dtype=f16
expect_error "kv_dtype of a conv LM" "a gated-conv model has no KV cache" "" -- \
  "$LOOM" run --model=random:gated-conv-tiny --tokens=2 --kv_dtype=bf16
expect_error "kv_dtype of export" "--kv_dtype is not a flag of loom export" "$WORK/kv_export" -- \
  "$LOOM" export --model=random:tiny --out="$WORK/kv_export" --kv_dtype=bf16
# A prompt in passes of 4 rows (--prefill_chunk), and with buckets: the oracle's tokens.
"$LOOM" run --model="$WORK/tiny_hf" --prompt=1,2,3,4,5,6,7,8,9,10 --tokens=8 --prefill_chunk=4 --prefill_buckets \
  --check 2>/dev/null | grep -q "identical to the op-by-op oracle" && pass "run --prefill_chunk=4 --check" ||
  fail "run --prefill_chunk=4 --check"
expect_error "prefill_chunk" "--prefill_chunk must be >= 0" "" -- "$LOOM" run --model=random:tiny --prefill_chunk=-1
# A prompt in its bucket's pass (--prefill_buckets, the default) and in its own (=false): the oracle's tokens.
"$LOOM" run --model="$WORK/tiny_hf" --prompt=1,2,3,4,5,6,7,8,9,10 --tokens=8 --prefill_buckets --check 2>/dev/null |
  grep -q "identical to the op-by-op oracle" && pass "run --prefill_buckets --check" || fail "run --prefill_buckets --check"
"$LOOM" run --model="$WORK/tiny_hf" --prompt=1,2,3,4,5,6,7,8,9,10 --tokens=8 --prefill_buckets=false --check \
  2>/dev/null | grep -q "identical to the op-by-op oracle" && pass "run --prefill_buckets=false --check" ||
  fail "run --prefill_buckets=false --check"
for c in compile inspect run export quantize; do
  "$LOOM" $c --help | grep -q "usage: loom $c" && pass "$c --help" || fail "$c --help"
done

# --- bad input --------------------------------------------------------------
expect_error "unknown preset" "unknown preset 'random:gpt9'" "$WORK/x.pb" -- \
  "$LOOM" compile --model=random:gpt9 --out="$WORK/x.pb"
expect_error "missing folder" "not a model folder" "$WORK/x.pb" -- \
  "$LOOM" compile --model="$WORK/nope" --out="$WORK/x.pb"
mkdir -p "$WORK/cfg_missing" && echo '{"model_type": "llama", "hidden_size": 8}' >"$WORK/cfg_missing/config.json"
expect_error "config missing field" "config.json: missing field 'num_hidden_layers'" "$WORK/x.pb" -- \
  "$LOOM" compile --model="$WORK/cfg_missing" --out="$WORK/x.pb"
cp -r "$WORK/tiny_hf" "$WORK/trunc" && truncate -s 1000 "$WORK/trunc/model.safetensors"
expect_error "truncated safetensors" "trunc/model.safetensors" "" -- \
  "$LOOM" run --model="$WORK/trunc" --tokens=2
cp -r "$WORK/tiny_hf" "$WORK/lying" && printf '\xff\xff\xff\xff\x00\x00\x00\x00' | dd of="$WORK/lying/model.safetensors" conv=notrunc 2>/dev/null
expect_error "lying header length" "lying/model.safetensors" "" -- "$LOOM" run --model="$WORK/lying" --tokens=2
cp -r "$WORK/tiny_hf" "$WORK/shape" && sed -i 's/"intermediate_size": 512/"intermediate_size": 640/' "$WORK/shape/config.json"
expect_error "shape vs config" "config.json implies [640,256]" "" -- "$LOOM" run --model="$WORK/shape" --tokens=2
# The KV cache sized from the request: a prompt past the default 4096 positions runs without --max_seq where
# max_position_embeddings allows, and is refused naming that limit where it does not.
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c.update(max_position_embeddings=8192, num_hidden_layers=1); json.dump(c, open(sys.argv[2],'w'))" \
  "$WORK/tiny_hf/config.json" "$WORK/long.json"
LONG=$(python3 -c "print(','.join(str(i * 7919 % 1000) for i in range(4200)))")
"$LOOM" run --model="random:$WORK/long.json" --prompt="$LONG" --tokens=2 2>/dev/null | grep -q "^tokens:" &&
  pass "a 4200-token prompt sizes the KV cache" || fail "a 4200-token prompt sizes the KV cache"
expect_error "request past max_position_embeddings" "exceed the KV cache of 512 (the model's max_position_embeddings, 512)" "" -- \
  "$LOOM" run --model="$WORK/tiny_hf" --prompt="$LONG" --tokens=2
# Hostile or unsupported config.json fields: refused by `loom compile` (no weights read, nothing on a GPU),
# one line naming the file and the field. hostile NAME WANT PYTHON-EDIT-OF-c [extra loom flags]
hostile() {
  local name="$1" want="$2" edit="$3"
  shift 3
  rm -rf "$WORK/hostile" && cp -r "$WORK/tiny_hf" "$WORK/hostile"
  python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); $edit; json.dump(c, open(p,'w'))" \
    "$WORK/hostile/config.json"
  expect_error "config: $name" "$want" "$WORK/h.pb" -- "$LOOM" compile --model="$WORK/hostile" --out="$WORK/h.pb" "$@"
}
hostile "gelu" "hostile/config.json: field 'hidden_act' = \"gelu\"" 'c["hidden_act"]="gelu"'
hostile "dynamic rope (5.x layout)" "field 'rope_parameters.rope_type' = \"dynamic\": rope type not supported" \
  'c.pop("rope_scaling"); c["rope_parameters"]={"rope_type":"dynamic","factor":2.0,"rope_theta":10000.0}'
hostile "layouts disagree" "field 'rope_parameters'" \
  'c["rope_parameters"]={"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64}'
hostile "sliding window" "hostile/config.json: sliding_window 4 (layer 0) is smaller than the KV cache of 512" \
  'c["sliding_window"]=4'
hostile "partial rotary" "field 'partial_rotary_factor' = 0.5" 'c["partial_rotary_factor"]=0.5'
hostile "quantized" "field 'quantization_config.quant_method' = \"bitsandbytes\": Loom reads compressed-tensors, AWQ and GPTQ" 'c["quantization_config"]={"quant_method":"bitsandbytes","load_in_4bit":True}'
hostile "not a causal LM" "field 'architectures'" 'c["architectures"]=["LlamaForSequenceClassification"]'
hostile "unknown family" "field 'model_type' = \"phi3\"" 'c["model_type"]="phi3"'
hostile "missing vocab" "hostile/config.json: missing field 'vocab_size'" 'c.pop("vocab_size")'
hostile "kv heads" "field 'num_key_value_heads' = 3: does not divide" 'c["num_key_value_heads"]=3'
hostile "eps" "field 'rms_norm_eps'" 'c["rms_norm_eps"]="small"'
hostile "biases the weights lack" "weight 'model.layers.0.self_attn.q_proj.bias' is missing" 'c["attention_bias"]=True'
hostile "qwen3 without q/k norms" "weight 'model.layers.0.self_attn.q_norm.weight' is missing" 'c["model_type"]="qwen3"'
hostile "qwen2 layer type" "layer 1 has type \"linear_attention\"" \
  'c["model_type"]="qwen2"; c["layer_types"]=["full_attention","linear_attention"]'
hostile "rope_theta in both layouts" "field 'rope_parameters.rope_theta' = 1000.0: disagrees with the top-level" \
  'c["rope_scaling"]={"rope_type":"linear","factor":2.0}; c["rope_parameters"]={"rope_type":"linear","factor":2.0,"rope_theta":1000.0}'
# config.json that is not JSON: where and what, on one line.
rm -rf "$WORK/nan" && cp -r "$WORK/tiny_hf" "$WORK/nan" && sed -i 's/"rms_norm_eps": [^,]*/"rms_norm_eps": NaN/' "$WORK/nan/config.json"
expect_error "NaN in config.json" "nan/config.json: not valid JSON: parse error at line" "" -- \
  "$LOOM" run --model="$WORK/nan" --tokens=2
truncate -s 100 "$WORK/nan/config.json"
expect_error "truncated config.json" "unexpected end of input" "" -- "$LOOM" run --model="$WORK/nan" --tokens=2
# Implausible sizes (each was minutes, gigabytes or std::bad_alloc): one line naming the field, in seconds and within
# 2 GB of address space (ulimit -v), weights loaded or not.
bounded() { (ulimit -v 2000000 && timeout 20 "$@"); }
for layers in 1e5 1e6 1e9; do
  rm -rf "$WORK/layers" && cp -r "$WORK/tiny_hf" "$WORK/layers" &&
    sed -i "s/\"num_hidden_layers\": [0-9]*/\"num_hidden_layers\": $layers/" "$WORK/layers/config.json"
  expect_error "num_hidden_layers $layers" "layers/config.json: field 'num_hidden_layers' = " "" -- \
    bounded "$LOOM" run --model="$WORK/layers" --tokens=2
  expect_error "random: with num_hidden_layers $layers" "implausible: more than 1024" "" -- \
    bounded "$LOOM" run --model="random:$WORK/layers/config.json" --tokens=2
done
# A plausible count the files do not hold: the missing weight is named before any graph is built.
sed -i "s/\"num_hidden_layers\": [0-9.e]*/\"num_hidden_layers\": 1000/" "$WORK/layers/config.json"
expect_error "more layers than the weights" "weight 'model.layers.2.input_layernorm.weight' is missing" "" -- \
  bounded "$LOOM" run --model="$WORK/layers" --tokens=2
# A 246B-parameter architecture with random weights: refused by host memory, needs and has, before any is made.
cat >"$WORK/246b.json" <<'JSON'
{"model_type": "llama", "hidden_size": 16384, "num_hidden_layers": 80, "num_attention_heads": 128,
 "num_key_value_heads": 16, "intermediate_size": 49152, "vocab_size": 128256, "max_position_embeddings": 8192}
JSON
expect_error "random:<246B config>" "GB of host memory (245.80B parameters: 491.6 GB of bf16 weights" "" -- \
  bounded "$LOOM" run --model="random:$WORK/246b.json" --tokens=2
# Weights that are not finite: refused while packing, naming the weight; weights that overflow at run time: the
# non-finite logits are said (exit 1), not printed as argmax tokens. poke FOLDER TENSOR BF16-BITS (every element).
poke() {
  python3 - "$1/model.safetensors" "$2" "$3" <<'PY'
import json, struct, sys
path, name, bits = sys.argv[1], sys.argv[2], int(sys.argv[3], 16)
data = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
begin, end = json.loads(data[8:8 + n])[name]["data_offsets"]
data[8 + n + begin:8 + n + end] = struct.pack("<H", bits) * ((end - begin) // 2)
open(path, "wb").write(data)
PY
}
rm -rf "$WORK/nanw" && cp -r "$WORK/tiny_hf" "$WORK/nanw" && poke "$WORK/nanw" model.layers.1.mlp.up_proj.weight 7FC0
expect_error "NaN weights" "weight 'model.layers.1.mlp.up_proj.weight' holds nan at [0,0]: Loom refuses weights that are not finite" "" -- \
  "$LOOM" run --model="$WORK/nanw" --tokens=4
rm -rf "$WORK/big" && cp -r "$WORK/tiny_hf" "$WORK/big" && poke "$WORK/big" model.norm.weight 7F7F
expect_error "overflowing logits" "are not finite" "$WORK/big.logits" -- \
  "$LOOM" run --model="$WORK/big" --tokens=4 --logits_out="$WORK/big.logits"
# The window covers the whole (smaller) cache: full attention is exact, so it compiles.
rm -rf "$WORK/win" && cp -r "$WORK/tiny_hf" "$WORK/win" && sed -i 's/"rope_scaling"/"sliding_window": 64, "rope_scaling"/' "$WORK/win/config.json"
"$LOOM" compile --model="$WORK/win" --max_seq=64 --out="$WORK/win.pb" >/dev/null 2>&1 && pass "window >= cache compiles" ||
  fail "window >= cache compiles"
# Every family's tiny model, exported and run from its folder on the CPU VM, against the oracle.
for fam in mistral qwen2 qwen3; do
  "$LOOM" export --model=random:tiny-$fam --out="$WORK/$fam" >/dev/null &&
    "$LOOM" run --model="$WORK/$fam" --tokens=8 --prompt=5,6,7 --check 2>/dev/null |
    grep -q "identical to the op-by-op oracle" && pass "$fam folder" || fail "$fam folder"
done

echo 'garbage' >"$WORK/bad.pb"
expect_error "corrupt schedule" "$WORK/bad.pb" "" -- "$LOOM" inspect "$WORK/bad.pb"
printf 'format_version: 9\nnum_sms: 1\nqueues { instructions { opcode: "WARP_DRIVE" } }\n' >"$WORK/op.pbtxt"
expect_error "unknown opcode" "unknown opcode 'WARP_DRIVE'" "" -- "$LOOM" inspect "$WORK/op.pbtxt"
sed 's/io.tokens/io.tokens/' "$WORK/tiny.pbtxt" | awk '/arena_bytes/{print "arena_bytes: 64"; next} {print}' >"$WORK/overflow.pbtxt"
expect_error "arena overflow" "overflows the ARENA region" "" -- "$LOOM" inspect "$WORK/overflow.pbtxt"
expect_error "bad options flag" "--policy: unknown policy 'fastest'" "$WORK/y.pb" -- \
  "$LOOM" compile --model=random:tiny --policy=fastest --out="$WORK/y.pb"
echo 'num_sms: "many"' >"$WORK/opts.pbtxt"
expect_error "bad options file" "opts.pbtxt" "$WORK/y.pb" -- \
  "$LOOM" compile --model=random:tiny --options="$WORK/opts.pbtxt" --out="$WORK/y.pb"
expect_error "unwritable output" "cannot write" "" -- \
  "$LOOM" compile --model=random:tiny --out="$WORK/no/such/dir/s.pb"
expect_error "bad prompt" "--prompt: 'x' is not a token id" "" -- "$LOOM" run --model=random:tiny --prompt=1,x
expect_error "empty prompt token" "--prompt: token 2 is empty" "" -- "$LOOM" run --model=random:tiny --prompt=1,,2
expect_error "trailing comma in prompt" "--prompt: token 3 is empty (a trailing comma?)" "" -- \
  "$LOOM" run --model=random:tiny --prompt=1,2,
expect_error "prompt outside vocab" "outside the vocabulary" "" -- "$LOOM" run --model=random:tiny --prompt=5000
# Flags where they have no effect are refused, not ignored (a trace never written, a repeat that timed nothing).
expect_error "--trace on the CPU" "--trace has no effect here: traces time the GPU kernel" "$WORK/t.json" -- \
  "$LOOM" run --model=random:tiny --trace="$WORK/t.json"
expect_error "--repeat on a decoder run" "--repeat has no effect here" "" -- "$LOOM" run --model=random:tiny --repeat=3
expect_error "--steps_per_launch on the CPU" "--steps_per_launch has no effect here" "" -- \
  "$LOOM" run --model=random:tiny --steps_per_launch=2
expect_error "another command's flag" "--tokens is not a flag of loom export" "$WORK/ex" -- \
  "$LOOM" export --model=random:tiny --out="$WORK/ex" --tokens=3
# No GPU: said as such (not a driver version), before the model is loaded.
if [ ! -e /dev/nvidiactl ]; then
  expect_error "--backend=gpu without a GPU" "--backend=gpu: no CUDA device" "" -- \
    "$LOOM" run --model=random:tiny --backend=gpu
fi
expect_error "too many tokens" "exceed the KV cache" "" -- "$LOOM" run --model=random:tiny --max_seq=16 --tokens=40
expect_error "unknown command" "unknown command 'fly'" "" -- "$LOOM" fly

# random:<config.json>: a checkpoint's architecture with random weights (TinyLlama's shape here, compiled only).
"$LOOM" compile --model="random:$DATA/hf_configs/transformers5/tinyllama-1.1b.json" --out="$WORK/tl.pb" >/dev/null 2>&1 &&
  [ -s "$WORK/tl.pb" ] && pass "random:<config.json> compiles" || fail "random:<config.json> compiles"
expect_error "random:<missing json>" "no-such.json" "$WORK/tl2.pb" -- \
  "$LOOM" compile --model="random:$WORK/no-such.json" --out="$WORK/tl2.pb"

# ONNX models (Debian's libonnx-testdata, when installed): imported, lowered to one graph pass and run against the
# oracle; an op the lowering lacks is refused by op, one the importer does not map naming the node; a file that is
# not a model names the file. Inputs and outputs as .npy files round-trip.
# The gated depthwise-conv LM: prefill + decode against the oracle, an exported folder loads back the same.
"$LOOM" run --model=random:gated-conv-tiny --prompt=5,6,7,8,9,10,11,12,13,14 --tokens=6 --check 2>&1 |
  grep -q "identical to the op-by-op oracle" && pass "gated-conv prefill + decode --check" ||
  fail "gated-conv prefill + decode --check"
"$LOOM" export --model=random:gated-conv-tiny --out="$WORK/gc" >/dev/null &&
  [ "$("$LOOM" run --model="$WORK/gc" --prompt=3,4,5 --tokens=4 2>/dev/null | grep tokens:)" = \
    "$("$LOOM" run --model=random:gated-conv-tiny --prompt=3,4,5 --tokens=4 2>/dev/null | grep tokens:)" ] &&
  pass "gated-conv export + load folder" || fail "gated-conv export + load folder"
cp -r "$WORK/gc" "$WORK/gc_bad" && sed -i 's/"conv_kernel": 4/"conv_kernel": "four"/' "$WORK/gc_bad/config.json"
expect_error "gated-conv bad config" "gc_bad/config.json: 'conv_kernel' must be an integer" "" -- \
  "$LOOM" run --model="$WORK/gc_bad" --tokens=2
cp -r "$WORK/gc" "$WORK/gc_k3" && sed -i 's/"conv_kernel": 4/"conv_kernel": 3/' "$WORK/gc_k3/config.json"
expect_error "gated-conv weights vs config" "weight 'layers.0.conv.weight' has shape [64,4], the graph needs [64,3]" "" -- \
  "$LOOM" run --model="$WORK/gc_k3" --tokens=2

: >"$WORK/empty.onnx"
expect_error "empty onnx" "empty.onnx: empty file, not an ONNX model" "" -- "$LOOM" run --model="$WORK/empty.onnx"

ONNX=/usr/share/libonnx-testdata/data
if [ -d "$ONNX" ]; then
  "$LOOM" compile --model="$ONNX/pytorch-converted/test_Conv2d/model.onnx" --out="$WORK/onnx.pb" >/dev/null &&
    "$LOOM" inspect "$WORK/onnx.pb" | grep -q "CONV_GEMM" && "$LOOM" inspect "$WORK/onnx.pb" | grep -q "graph pass" &&
    pass "onnx conv compiles to CONV_GEMM" ||
    fail "onnx conv compiles to CONV_GEMM"
  "$LOOM" run --model="$ONNX/pytorch-converted/test_Conv2d/model.onnx" --check 2>/dev/null |
    grep -q "every output agrees with the op-by-op oracle" && pass "onnx conv run --check" || fail "onnx conv run --check"
  IM2COL_OPTIONS="$(cd "$(dirname "$0")/.." && pwd)/tools/bench_options/conv_im2col.pbtxt"
  "$LOOM" compile --model="$ONNX/pytorch-converted/test_Conv2d/model.onnx" --options="$IM2COL_OPTIONS" \
    --out="$WORK/onnx_im2col.pb" >/dev/null && "$LOOM" inspect "$WORK/onnx_im2col.pb" | grep -q "IM2COL" &&
    "$LOOM" run --model="$ONNX/pytorch-converted/test_Conv2d/model.onnx" --options="$IM2COL_OPTIONS" --check \
      2>/dev/null | grep -q "every output agrees with the op-by-op oracle" &&
    pass "onnx conv as IM2COL + GEMM (conv_im2col) run --check" || fail "onnx conv as IM2COL + GEMM run --check"
  mkdir -p "$WORK/npy1" "$WORK/npy2"
  R="$ONNX/pytorch-converted/test_ReLU/model.onnx"
  "$LOOM" run --model="$R" --out="$WORK/npy1" >/dev/null 2>&1 && out=$(ls "$WORK/npy1") &&
    "$LOOM" run --model="$R" --input="$WORK/npy1/$out" --out="$WORK/npy2" >/dev/null 2>&1 &&
    cmp -s "$WORK/npy1/$out" "$WORK/npy2/$out" && pass "onnx run --input/--out .npy round trip" ||
    fail "onnx run --input/--out .npy round trip"
  # --out names a folder: created as export creates its own.
  "$LOOM" run --model="$R" --out="$WORK/npy3/deeper" >/dev/null 2>&1 && [ -n "$(ls "$WORK/npy3/deeper")" ] &&
    pass "onnx run --out creates the folder" || fail "onnx run --out creates the folder"
  expect_error "--tokens on a general graph" "--tokens has no effect here: a general graph (ONNX)" "" -- \
    "$LOOM" run --model="$R" --tokens=5
  expect_error "onnx missing input file" "no-such.npy: cannot open" "" -- \
    "$LOOM" run --model="$R" --input="$WORK/no-such.npy"
  expect_error "onnx input of another shape" "must be f32 [" "" -- \
    "$LOOM" run --model="$R" --input="$WORK/npy1/$out" --model="$ONNX/pytorch-converted/test_Conv2d/model.onnx"
  "$LOOM" run --model="$ONNX/pytorch-converted/test_Conv2d_depthwise/model.onnx" --check 2>/dev/null |
    grep -q "every output agrees" && pass "onnx depthwise conv run --check" || fail "onnx depthwise conv run --check"
  "$LOOM" compile --model="$ONNX/pytorch-converted/test_Conv2d_depthwise_with_multiplier/model.onnx" \
    --out="$WORK/dw.pb" >/dev/null 2>&1 && "$LOOM" inspect "$WORK/dw.pb" | grep -q "^  DWCONV " &&
    pass "onnx depthwise conv lowers to DWCONV" || fail "onnx depthwise conv lowers to DWCONV"
  "$LOOM" run --model="$ONNX/node/test_matmul_3d/model.onnx" --check 2>/dev/null |
    grep -q "every output agrees" && pass "onnx product of two activations run --check" ||
    fail "onnx product of two activations run --check"
  expect_error "onnx unsupported op" "(Cos): op type not supported" "$WORK/onnx2.pb" -- \
    "$LOOM" compile --model="$ONNX/node/test_cos/model.onnx" --out="$WORK/onnx2.pb"
  printf 'not a model' >"$WORK/bad.onnx"
  expect_error "onnx garbage" "bad.onnx: not an ONNX model file" "$WORK/onnx3.pb" -- \
    "$LOOM" compile --model="$WORK/bad.onnx" --out="$WORK/onnx3.pb"
else
  echo "skip: ONNX cases ($ONNX missing: apt-get install libonnx-testdata)"
fi

# tools/decode_ab.py over a fake loom_bench (prints loom_bench's rows; ms/token from FAKE_MS, 1.0 by default): the
# builds alternate, their environment and own flags reach them, medians and differences come out, failures are named.
TOOLS="$(cd "$(dirname "$0")/../tools" && pwd)"
cat >"$WORK/fake_bench" <<'FAKE'
#!/usr/bin/env bash
echo "$0 $*" >>"$(dirname "$0")/calls"
ms=${FAKE_MS:-1.0}; models=""
for a in "$@"; do [ "$a" = --slow ] && ms=2.0; [[ "$a" == --models=* ]] && models=${a#--models=}; done
for model in ${models//,/ }; do
  echo "model $model: 2.471 GB of weights read per token, 132 SMs"
  for c in 128 1024; do printf "%8d %8d %12.4f %5.3f..%5.3f %10.3f %9.2fx %14.4f\n" $c 64 "$ms" 0 0 0.8 1 0.5; done
done
FAKE
chmod +x "$WORK/fake_bench"
if command -v python3 >/dev/null; then
  ab=$(python3 "$TOOLS/decode_ab.py" "a=$WORK/fake_bench" "b=FAKE_MS=1.1 $WORK/fake_bench" "c=$WORK/fake_bench --slow" \
    --models=random:m1,random:m2 --rounds=2 2>&1)
  [ "$(grep -c -- '--slow' "$WORK/calls")" -eq 2 ] && [ "$(sed -n 4p "$WORK/calls" | grep -c -- '--slow')" -eq 1 ] &&
    [[ "$ab" == *"1.1000 (+10.0%)"* ]] && [[ "$ab" == *"2.0000 (+100.0%)"* ]] &&
    pass "decode_ab alternates builds and reports medians" || fail "decode_ab: $ab"
  ab=$(python3 "$TOOLS/decode_ab.py" "a=$WORK/fake_bench" "b=$WORK/no_such_bench" 2>&1)
  [ $? -ne 0 ] && [[ "$ab" == *"build b failed"* ]] && pass "decode_ab names a failing build" ||
    fail "decode_ab failing build: $ab"
fi

echo "$failures failure(s)"
[ $failures -eq 0 ]
