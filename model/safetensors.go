package model

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// DType is a safetensors element type.
type DType string

// The element types kiln reads and writes: F32 weights, BF16 weights for
// smaller checkpoints, I32 token ids in batch files.
const (
	F32  DType = "F32"
	BF16 DType = "BF16"
	I32  DType = "I32"
)

// size is the element size in bytes, 0 for a type kiln does not handle.
func (d DType) size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16:
		return 2
	}
	return 0
}

// rank orders dtypes as the safetensors library does when it lays out a
// file (larger, by its enum order, first), so that a file kiln writes has
// the same data order and offsets as one transformers writes.
func (d DType) rank() int {
	switch d {
	case BF16:
		return 12
	case I32:
		return 13
	case F32:
		return 15
	}
	return 0
}

// Tensor is one named tensor of a safetensors file, its data little-endian.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// SafetensorsFile is a whole safetensors file: the optional string metadata
// (transformers expects {"format": "pt"}) and the tensors in data order.
type SafetensorsFile struct {
	Metadata map[string]string
	Tensors  []Tensor
}

// Tensor returns the named tensor, or nil.
func (f *SafetensorsFile) Tensor(name string) *Tensor {
	for i := range f.Tensors {
		if f.Tensors[i].Name == name {
			return &f.Tensors[i]
		}
	}
	return nil
}

// FormatError is a malformed or truncated safetensors file. It is the
// caller's input to fix, so it reports BadInput.
type FormatError struct {
	Path string
	Msg  string
}

func (e *FormatError) Error() string  { return e.Path + ": " + e.Msg }
func (e *FormatError) BadInput() bool { return true }

// maxHeader bounds the JSON header (the safetensors library uses 100 MB) so
// that a corrupt length cannot make a reader allocate the machine away.
const maxHeader = 100 << 20

// ReadSafetensors reads and validates a whole safetensors file.
func ReadSafetensors(path string) (*SafetensorsFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read safetensors: %w", err)
	}
	return DecodeSafetensors(path, b)
}

type headerEntry struct {
	DType       DType    `json:"dtype"`
	Shape       []int    `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// DecodeSafetensors parses the bytes of a safetensors file; path only names
// it in errors. Every tensor must lie inside the data and its byte length
// must match its shape, so a truncated copy is reported, never half-read.
func DecodeSafetensors(path string, b []byte) (*SafetensorsFile, error) {
	bad := func(format string, args ...any) error {
		return &FormatError{Path: path, Msg: fmt.Sprintf(format, args...)}
	}
	if len(b) < 8 {
		return nil, bad("truncated: %d bytes, too short for the 8-byte header length; the file is incomplete, copy or save it again", len(b))
	}
	n := binary.LittleEndian.Uint64(b[:8])
	if n > maxHeader {
		return nil, bad("header length %d is implausible: this is not a safetensors file", n)
	}
	if uint64(len(b)-8) < n {
		return nil, bad("truncated: the header needs %d bytes but only %d follow; the file is incomplete, copy or save it again", n, len(b)-8)
	}
	header, data := b[8:8+n], b[8+n:]
	meta, entries, err := parseHeader(path, header, int64(len(data)))
	if err != nil {
		return nil, err
	}
	f := &SafetensorsFile{Metadata: meta}
	for _, e := range entries {
		f.Tensors = append(f.Tensors, Tensor{Name: e.Name, DType: e.DType, Shape: e.Shape, Data: data[e.start:e.end]})
	}
	return f, nil
}

// TensorInfo is one tensor as a safetensors header describes it.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int
}

type headerTensor struct {
	TensorInfo
	start, end int64
}

// parseHeader reads a safetensors JSON header whose data section holds
// dataLen bytes, and returns the tensors in data order.
func parseHeader(path string, header []byte, dataLen int64) (map[string]string, []headerTensor, error) {
	bad := func(format string, args ...any) error {
		return &FormatError{Path: path, Msg: fmt.Sprintf(format, args...)}
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(header, &raw); err != nil {
		return nil, nil, bad("header is not valid JSON (%v): this is not a safetensors file", err)
	}
	var meta map[string]string
	var out []headerTensor
	for name, r := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(r, &meta); err != nil {
				return nil, nil, bad("__metadata__ must map strings to strings: %v", err)
			}
			continue
		}
		var h headerEntry
		if err := json.Unmarshal(r, &h); err != nil {
			return nil, nil, bad("tensor %s: malformed header entry: %v", name, err)
		}
		if h.DType.size() == 0 {
			return nil, nil, bad("tensor %s has dtype %s: kiln reads F32, BF16 and I32; convert the file with safetensors in Python", name, h.DType)
		}
		start, end := h.DataOffsets[0], h.DataOffsets[1]
		if start < 0 || end < start {
			return nil, nil, bad("tensor %s has invalid data_offsets [%d, %d]", name, start, end)
		}
		if end > dataLen {
			return nil, nil, bad("truncated: tensor %s ends at byte %d of the data but the file holds %d data bytes; the file is incomplete, copy or save it again", name, end, dataLen)
		}
		// The element count is bounded by the bytes it must span, so that
		// an absurd shape is reported instead of overflowing.
		elems := int64(1)
		for _, d := range h.Shape {
			if d < 0 {
				return nil, nil, bad("tensor %s has a negative dimension in shape %v", name, h.Shape)
			}
			if d > 0 && elems > (end-start)/int64(d)+1 {
				return nil, nil, bad("tensor %s: shape %v of %s does not fit the %d bytes its data_offsets span", name, h.Shape, h.DType, end-start)
			}
			elems *= int64(d)
		}
		if want := elems * int64(h.DType.size()); end-start != want {
			return nil, nil, bad("tensor %s: shape %v of %s needs %d bytes but data_offsets span %d", name, h.Shape, h.DType, want, end-start)
		}
		out = append(out, headerTensor{TensorInfo{name, h.DType, h.Shape}, start, end})
	}
	// Keep data order: the JSON map loses the header's key order, and the
	// offsets are what the writer followed.
	sort.SliceStable(out, func(a, b int) bool { return out[a].start < out[b].start })
	return meta, out, nil
}

// ReadSafetensorsHeader reads only the header of a safetensors file: the
// tensors' names, dtypes and shapes, each checked against the file's size.
// It reads at most the header's bytes, however large the file.
func ReadSafetensorsHeader(path string) ([]TensorInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read safetensors header: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read safetensors header: %w", err)
	}
	bad := func(format string, args ...any) error {
		return &FormatError{Path: path, Msg: fmt.Sprintf(format, args...)}
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return nil, bad("truncated: %d bytes, too short for the 8-byte header length; the file is incomplete, copy or save it again", st.Size())
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > maxHeader {
		return nil, bad("header length %d is implausible: this is not a safetensors file", n)
	}
	if uint64(st.Size()-8) < n {
		return nil, bad("truncated: the header needs %d bytes but only %d follow; the file is incomplete, copy or save it again", n, st.Size()-8)
	}
	header := make([]byte, n)
	if _, err := io.ReadFull(f, header); err != nil {
		return nil, fmt.Errorf("read safetensors header %s: %w", path, err)
	}
	_, entries, err := parseHeader(path, header, st.Size()-8-int64(n))
	if err != nil {
		return nil, err
	}
	out := make([]TensorInfo, len(entries))
	for i, e := range entries {
		out[i] = e.TensorInfo
	}
	return out, nil
}

// CheckWeights compares config c with the tensors of the safetensors file
// at path (as its header lists them), before anything is sized from c: the
// embedding's shape must be (vocab_size, hidden_size) and the file must
// hold num_hidden_layers layers before the tensors are listed one by one,
// so that a config.json of 1e8 layers beside tiny weights is refused
// without being materialised. A tied model may carry an lm_head.weight of
// the embedding's shape; ParamsFromFile then checks it equals the
// embeddings.
func CheckWeights(path string, tensors []TensorInfo, c Config) error {
	if err := c.Validate(); err != nil {
		return &FormatError{Path: filepath.Join(filepath.Dir(path), "config.json"), Msg: err.Error()}
	}
	byName := make(map[string]TensorInfo, len(tensors))
	layers := 0
	for _, t := range tensors {
		byName[t.Name] = t
		if rest, ok := strings.CutPrefix(t.Name, "model.layers."); ok {
			i, _, _ := strings.Cut(rest, ".")
			if l, err := strconv.Atoi(i); err == nil && l >= 0 && l < len(tensors) {
				layers = max(layers, l+1)
			}
		}
	}
	mismatch := func(format string, args ...any) error {
		return &FormatError{Path: path, Msg: fmt.Sprintf(format, args...) + ": the config.json does not belong to these weights; use the config.json saved with them"}
	}
	emb, ok := byName["model.embed_tokens.weight"]
	switch {
	case !ok:
		return &ShapeError{Path: path, Tensor: "model.embed_tokens.weight", Want: []int{c.VocabSize, c.Hidden}}
	case len(emb.Shape) != 2 || emb.Shape[0] != c.VocabSize || emb.Shape[1] != c.Hidden:
		return &ShapeError{Path: path, Tensor: "model.embed_tokens.weight", Want: []int{c.VocabSize, c.Hidden}, Got: emb.Shape}
	case layers != c.Layers:
		return mismatch("the file holds %d decoder layer(s) but config.json says num_hidden_layers %d", layers, c.Layers)
	}
	known := map[string]bool{}
	for _, s := range c.Specs() {
		known[s.Name] = true
		t, ok := byName[s.Name]
		if !ok {
			return &ShapeError{Path: path, Tensor: s.Name, Want: s.Shape}
		}
		if !slices.Equal(t.Shape, s.Shape) {
			return &ShapeError{Path: path, Tensor: s.Name, Want: s.Shape, Got: t.Shape}
		}
	}
	var extra []string
	for _, t := range tensors {
		if known[t.Name] || t.Name == "lm_head.weight" && c.TieEmbeddings && slices.Equal(t.Shape, []int{c.VocabSize, c.Hidden}) {
			continue
		}
		extra = append(extra, t.Name)
	}
	if len(extra) > 0 {
		hint := ""
		if len(extra) == 1 && extra[0] == "lm_head.weight" {
			hint = " (the file has an untied lm_head: set tie_word_embeddings false)"
		}
		return &FormatError{Path: path, Msg: fmt.Sprintf("tensors %v are not part of this model config%s; use the config.json saved with the weights", extra, hint)}
	}
	return nil
}

// EncodeSafetensors lays f out as the safetensors library does: tensors
// ordered by dtype (larger first) then name, the header's keys in that
// order after __metadata__, padded with spaces to a multiple of 8 bytes.
func EncodeSafetensors(f *SafetensorsFile) ([]byte, error) {
	ts := append([]Tensor(nil), f.Tensors...)
	sort.SliceStable(ts, func(i, j int) bool {
		if ri, rj := ts[i].DType.rank(), ts[j].DType.rank(); ri != rj {
			return ri > rj
		}
		return ts[i].Name < ts[j].Name
	})
	var h bytes.Buffer
	h.WriteByte('{')
	if len(f.Metadata) > 0 {
		h.WriteString(`"__metadata__":`)
		m, err := json.Marshal(f.Metadata)
		if err != nil {
			return nil, err
		}
		h.Write(m)
	}
	var off int64
	seen := map[string]bool{}
	for i, t := range ts {
		if t.DType.size() == 0 {
			return nil, fmt.Errorf("tensor %s: cannot write dtype %q", t.Name, t.DType)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("tensor %s appears twice", t.Name)
		}
		seen[t.Name] = true
		elems := 1
		for _, d := range t.Shape {
			elems *= d
		}
		if elems*t.DType.size() != len(t.Data) {
			return nil, fmt.Errorf("tensor %s: shape %v of %s needs %d bytes, have %d", t.Name, t.Shape, t.DType, elems*t.DType.size(), len(t.Data))
		}
		if i > 0 || len(f.Metadata) > 0 {
			h.WriteByte(',')
		}
		name, _ := json.Marshal(t.Name)
		h.Write(name)
		h.WriteString(`:{"dtype":"` + string(t.DType) + `","shape":[`)
		for k, d := range t.Shape {
			if k > 0 {
				h.WriteByte(',')
			}
			h.WriteString(strconv.Itoa(d))
		}
		end := off + int64(len(t.Data))
		fmt.Fprintf(&h, `],"data_offsets":[%d,%d]}`, off, end)
		off = end
	}
	h.WriteByte('}')
	for h.Len()%8 != 0 {
		h.WriteByte(' ')
	}
	out := make([]byte, 8, 8+h.Len()+int(off))
	binary.LittleEndian.PutUint64(out, uint64(h.Len()))
	out = append(out, h.Bytes()...)
	for _, t := range ts {
		out = append(out, t.Data...)
	}
	return out, nil
}

// WriteSafetensors writes f at path atomically (temporary file, then rename).
func WriteSafetensors(path string, f *SafetensorsFile) error {
	b, err := EncodeSafetensors(f)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return writeFileAtomic(path, b)
}

// F32Tensor makes an F32 tensor from values.
func F32Tensor(name string, shape []int, v []float32) Tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return Tensor{Name: name, DType: F32, Shape: append([]int(nil), shape...), Data: b}
}

// BF16Tensor makes a BF16 tensor from values, rounding to nearest even as
// PyTorch's .to(torch.bfloat16) does.
func BF16Tensor(name string, shape []int, v []float32) Tensor {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], ToBF16(x))
	}
	return Tensor{Name: name, DType: BF16, Shape: append([]int(nil), shape...), Data: b}
}

// I32Tensor makes an I32 tensor from values.
func I32Tensor(name string, shape []int, v []int32) Tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return Tensor{Name: name, DType: I32, Shape: append([]int(nil), shape...), Data: b}
}

// ToBF16 rounds x to bfloat16 (nearest, ties to even; NaN stays NaN).
func ToBF16(x float32) uint16 {
	u := math.Float32bits(x)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40 // quiet NaN
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// FromBF16 widens a bfloat16 to float32 exactly.
func FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32s decodes an F32 or BF16 tensor.
func (t *Tensor) Float32s() ([]float32, error) {
	switch t.DType {
	case F32:
		v := make([]float32, len(t.Data)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
		return v, nil
	case BF16:
		v := make([]float32, len(t.Data)/2)
		for i := range v {
			v[i] = FromBF16(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
		return v, nil
	}
	return nil, fmt.Errorf("tensor %s is %s, want F32 or BF16", t.Name, t.DType)
}

// Int32s decodes an I32 tensor.
func (t *Tensor) Int32s() ([]int32, error) {
	if t.DType != I32 {
		return nil, fmt.Errorf("tensor %s is %s, want I32", t.Name, t.DType)
	}
	v := make([]int32, len(t.Data)/4)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return v, nil
}

// ShapeError is a checkpoint whose tensors do not fit the configuration.
type ShapeError struct {
	Path, Tensor string
	Want, Got    []int
}

func (e *ShapeError) Error() string {
	if e.Got == nil {
		return fmt.Sprintf("%s: tensor %s (shape %v) is missing: the file was not saved for this model; use the config.json saved with it", e.Path, e.Tensor, e.Want)
	}
	return fmt.Sprintf("%s: tensor %s has shape %v but the model config expects %v: the weights belong to another model size; use the config.json saved with them (or the --model they were trained with)", e.Path, e.Tensor, e.Got, e.Want)
}

// BadInput marks a shape mismatch as the caller's to fix.
func (e *ShapeError) BadInput() bool { return true }

// LoadParams reads the parameters of c from a safetensors file (F32 or
// BF16) under their Hugging Face names. The file's header is checked
// against c before the file is read or anything is sized from c. A tied
// model's file carries no lm_head.weight; one that does is accepted only if
// it equals the embeddings, since otherwise tying would silently drop
// trained weights.
func LoadParams(path string, c Config) (*Params, error) {
	h, err := ReadSafetensorsHeader(path)
	if err != nil {
		return nil, err
	}
	if err := CheckWeights(path, h, c); err != nil {
		return nil, err
	}
	f, err := ReadSafetensors(path)
	if err != nil {
		return nil, err
	}
	return ParamsFromFile(path, f, c)
}

// ParamsFromFile fills parameters of c from a decoded file; path names it
// in errors. c is checked against the file's tensors (CheckWeights) before
// the parameters are allocated.
func ParamsFromFile(path string, f *SafetensorsFile, c Config) (*Params, error) {
	infos := make([]TensorInfo, len(f.Tensors))
	for i, t := range f.Tensors {
		infos[i] = TensorInfo{t.Name, t.DType, t.Shape}
	}
	if err := CheckWeights(path, infos, c); err != nil {
		return nil, err
	}
	p := NewParams(c)
	for _, s := range p.Specs() {
		v, err := f.Tensor(s.Name).Float32s()
		if err != nil {
			return nil, &FormatError{Path: path, Msg: err.Error() + "; save the weights as float32 or bfloat16"}
		}
		copy(p.Tensor(s.Name), v)
	}
	if t := f.Tensor("lm_head.weight"); t != nil && c.TieEmbeddings {
		// Some writers store the tied head anyway; it is the same tensor
		// only if it equals the embeddings.
		if v, err := t.Float32s(); err != nil || !slices.Equal(v, p.Tensor("model.embed_tokens.weight")) {
			return nil, &FormatError{Path: path, Msg: "tensors [lm_head.weight] are not part of this model config (the file has an untied lm_head: set tie_word_embeddings false); use the config.json saved with the weights"}
		}
	}
	return p, nil
}

// ParamsFile builds the safetensors file of p in dtype (F32 or BF16) with
// the {"format": "pt"} metadata transformers expects.
func ParamsFile(p *Params, dtype DType) (*SafetensorsFile, error) {
	f := &SafetensorsFile{Metadata: map[string]string{"format": "pt"}}
	for _, s := range p.Specs() {
		switch dtype {
		case F32:
			f.Tensors = append(f.Tensors, F32Tensor(s.Name, s.Shape, p.Tensor(s.Name)))
		case BF16:
			f.Tensors = append(f.Tensors, BF16Tensor(s.Name, s.Shape, p.Tensor(s.Name)))
		default:
			return nil, fmt.Errorf("parameters can be saved as F32 or BF16, not %s", dtype)
		}
	}
	return f, nil
}

// SaveParams writes p as a transformers-loadable model.safetensors.
func SaveParams(path string, p *Params, dtype DType) error {
	f, err := ParamsFile(p, dtype)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return WriteSafetensors(path, f)
}

// LoadCheckpoint reads config.json and model.safetensors from dir.
func LoadCheckpoint(dir string) (*Params, error) {
	c, err := ReadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, &FormatError{Path: dir, Msg: "no config.json: a checkpoint directory holds config.json and model.safetensors"}
		}
		return nil, err
	}
	return LoadParams(filepath.Join(dir, "model.safetensors"), c)
}
