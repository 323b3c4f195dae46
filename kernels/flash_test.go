package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// attnConfig is a one-layer model with the attention shape under test; the
// other sizes only need to be valid.
func attnConfig(H, KV int) model.Config {
	return model.Config{VocabSize: 256, Hidden: 64, Layers: 1, Heads: H, KVHeads: KV, HeadDim: 64, Intermediate: 64,
		MaxPositions: 1024, RopeTheta: 10000, RMSNormEps: 1e-5}
}

// bf16Values draws n normal values already rounded to bf16, so that both
// attention paths see identical inputs and differ only in their own
// arithmetic.
func bf16Values(r *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(uint32(model.ToBF16(float32(r.NormFloat64()))) << 16)
	}
	return out
}

// toBF16Bits rounds each value to bf16, as the device stores it.
func toBF16Bits(x []float32) []uint16 {
	out := make([]uint16, len(x))
	for i, v := range x {
		out[i] = model.ToBF16(v)
	}
	return out
}

// firstBitDiff is the first index where got and want differ in their bits,
// or -1.
func firstBitDiff(got, want []float32) int {
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}

// maxRelErr is the largest |got - want| over the largest |want|.
func maxRelErr(got, want []float32) float64 {
	var d, m float64
	for i := range want {
		d = math.Max(d, math.Abs(float64(got[i]-want[i])))
		m = math.Max(m, math.Abs(float64(want[i])))
	}
	return d / m
}

// The flash kernels against the straightforward ones (attention.cu, which
// the fp32 golden checks hold to transformers), forward and backward, at 12
// query heads over 4 key/value heads, head_dim 64, T a multiple of the
// 64-row tile and not, native and sm_80 builds. The flash path rounds the
// probabilities and their gradients to bf16 for the tensor cores (as
// PyTorch's flash attention does), which errs by about 2^-9 x sqrt(keys)
// of each output's scale: held to 1e-2 of each tensor's largest value.
// The flash path runs twice, with either forward kernel (flash_fwd, and
// flash_fwd128 with its 128-row tiles) feeding the backward kernels, whose
// results check the log-sum-exp each forward leaves.
func TestFlashMatchesStraightforward(t *testing.T) {
	skipWithoutGPU(t)
	const H, KV, D = 12, 4, 64
	for _, force := range []string{"0", "1"} {
		for _, sh := range []struct{ B, T int }{{1, 1024}, {2, 1000}} {
			t.Run(fmt.Sprintf("sm80=%s/B=%d/T=%d", force, sh.B, sh.T), func(t *testing.T) {
				t.Setenv("KILN_CUDA_FORCE_SM80", force)
				e := newEngine(t, attnConfig(H, KV), model.Options{Precision: "bf16", MaxBatch: 1, MaxSeq: 64})
				B, T := sh.B, sh.T
				N := B * T
				r := rand.New(rand.NewPCG(uint64(T), 7))
				q, k, v, dout := bf16Values(r, N*H*D), bf16Values(r, N*KV*D), bf16Values(r, N*KV*D), bf16Values(r, N*H*D)
				scale := float32(1 / math.Sqrt(D))
				type result struct {
					out, dq, dk, dv []float32
					outb, dvb       []uint16 // flash's bf16 copies of out and dv
					dqb, dkb        []uint16 // flash's bf16 dq and dk, rotated back by rope
					cos, sin        []float32
					lse             []float32 // flash's base-2 log-sum-exp
					dvec            []float32 // flash's rowsum(dout * out)
				}
				// run runs the straightforward kernels (rows 0) or the
				// flash ones: Hopper's (flash_sm90.cu), or flash.cu's with
				// the forward of that many query rows a block and the
				// backward in two kernels (split) or one.
				run := func(rows int, split, hopper bool) result {
					res := result{out: make([]float32, N*H*D), dq: make([]float32, N*H*D), dk: make([]float32, N*KV*D), dv: make([]float32, N*KV*D)}
					err := e.th.do(func() error {
						b := &testBuffers{e: e}
						f32 := func(n int) cuda.Ptr { return b.alloc(int64(n) * 4) }
						dq, dk, dv := f32(N*H*D), f32(N*KV*D), f32(N*KV*D)
						pq, pk, pv, pd, out := upload(b, q), upload(b, k), upload(b, v), upload(b, dout), f32(N*H*D)
						if rows > 0 || hopper {
							lse, dvec := f32(B*H*T), f32(B*H*T)
							// The flash kernels read q, k and v in bf16 as the
							// engine lays them out, column blocks of one
							// (N, P) matrix, and write dv's bf16 copy into
							// the same layout; the values are bf16 already, so
							// these are the same inputs. bf16 buffers hold
							// half as many 4-byte words as values.
							qd, kvd := H*D, KV*D
							P := qd + 2*kvd
							packed := make([]float32, N*P)
							for r := 0; r < N; r++ {
								copy(packed[r*P:], q[r*qd:(r+1)*qd])
								copy(packed[r*P+qd:], k[r*kvd:(r+1)*kvd])
								copy(packed[r*P+qd+kvd:], v[r*kvd:(r+1)*kvd])
							}
							qkv, bd := upload(b, toBF16Bits(packed)), upload(b, toBF16Bits(dout))
							outb, dqkv := f32(N*qd/2), f32(N*P/2)
							if b.err != nil {
								return b.err
							}
							pq, pk, pv, pd := qkv, bfAt(qkv, qd), bfAt(qkv, qd+kvd), bd
							e.flashRows, e.hopper = rows, hopper
							if err := e.flashForward(out, outb, lse, pq, pk, pv, B, T, H, KV, scale, P, P); err != nil {
								return err
							}
							tiles := flashTiles(T)
							if split {
								if err := e.flashBackwardSplit(dq, dqkv, dk, bfAt(dqkv, qd), dv, bfAt(dqkv, qd+kvd), dvec,
									pq, pk, pv, pd, outb, lse, B, T, H, KV, scale, P); err != nil {
									return err
								}
							} else {
								// The fused backward sums dq in fp32 scratch, in
								// an order its zeroed semaphores keep.
								dqacc, sem := f32(N*H*D), f32(B*H*tiles)
								if b.err != nil {
									return b.err
								}
								// The engine gives the one-pass kernel its shared
								// memory only when training takes it.
								one, size := "flash_bwd", flashBwdShared
								if hopper {
									one, size = "flash_bwd_h", hopperFusedShared
								}
								if e.shared[one] == 0 {
									if err := e.fns[one].AllowSharedMemory(size); err != nil {
										return err
									}
									e.shared[one] = size
								}
								if err := e.flashBackwardFused(dq, dqkv, dk, bfAt(dqkv, qd), dv, bfAt(dqkv, qd+kvd), dqacc, sem, dvec,
									pq, pk, pv, pd, outb, lse, B, T, H, KV, scale, P); err != nil {
									return err
								}
							}
							res.dvec = make([]float32, B*H*T)
							if err := cuda.Download(e.dv, res.dvec, dvec); err != nil {
								return err
							}
							res.cos, res.sin = make([]float32, T*D/2), make([]float32, T*D/2)
							if err := cuda.Download(e.dv, res.cos, e.cosT); err != nil {
								return err
							}
							if err := cuda.Download(e.dv, res.sin, e.sinT); err != nil {
								return err
							}
							res.outb = make([]uint16, N*qd)
							if err := cuda.Download(e.dv, res.outb, outb); err != nil {
								return err
							}
							res.lse = make([]float32, B*H*T)
							if err := cuda.Download(e.dv, res.lse, lse); err != nil {
								return err
							}
							all := make([]uint16, N*P)
							if err := cuda.Download(e.dv, all, dqkv); err != nil {
								return err
							}
							for r := 0; r < N; r++ {
								res.dqb = append(res.dqb, all[r*P:r*P+qd]...)
								res.dkb = append(res.dkb, all[r*P+qd:r*P+qd+kvd]...)
								res.dvb = append(res.dvb, all[r*P+qd+kvd:(r+1)*P]...)
							}
						} else {
							att, ds := f32(B*H*T*T), f32(B*H*T*T)
							if b.err != nil {
								return b.err
							}
							if err := e.launch3("attn_fwd", cuda.Dim3{X: T, Y: H, Z: B}, cuda.Dim3{X: 128}, out, att, pq, pk, pv, T, T, H, KV, D, 0, scale); err != nil {
								return err
							}
							if err := e.launch3("attn_bwd_q", cuda.Dim3{X: T, Y: H, Z: B}, cuda.Dim3{X: 128}, dq, ds, pd, att, pk, pv, T, T, H, KV, D, scale); err != nil {
								return err
							}
							if err := e.launch3("attn_bwd_kv", cuda.Dim3{X: T, Y: KV, Z: B}, cuda.Dim3{X: D}, dk, dv, ds, att, pq, pd, T, T, H, KV, D, scale); err != nil {
								return err
							}
						}
						for _, o := range []struct {
							dst []float32
							src cuda.Ptr
						}{{res.out, out}, {res.dq, dq}, {res.dk, dk}, {res.dv, dv}} {
							if err := cuda.Download(e.dv, o.dst, o.src); err != nil {
								return err
							}
						}
						return b.free()
					})
					if err != nil {
						t.Fatal(err)
					}
					return res
				}
				want := run(0, false, false)
				flash := map[string]result{}
				type variant struct {
					rows          int
					split, hopper bool
					pair          string // KILN_CUDA_FLASH_PAIR for the Hopper kernels
					tma           bool   // the Hopper kernels' tiles copied by the TMA
				}
				variants := []variant{{rows: 64, split: true}, {rows: 128, split: true}, {rows: 128}, {rows: 128}}
				// The Hopper kernels are built for a compute capability
				// 9.0 device's native build only.
				_, hopper := e.fns["flash_fwd_h"]
				if hopper {
					// Once with a pair of query tiles a block, once with
					// one: each tile's arithmetic is the same either way.
					variants = append(variants, variant{hopper: true, split: true, pair: "on"}, variant{hopper: true, split: true, pair: "off"},
						variant{hopper: true}, variant{hopper: true}, variant{hopper: true, split: true, tma: true})
				}
				tmaDefault := e.flashTMA
				for _, v := range variants {
					e.flashPair, e.flashTMA = v.pair, v.tma
					if v.tma && e.shared["flash_fwd_ht"] == 0 {
						// The engine gives them their shared memory only when
						// training takes them.
						for name, n := range map[string]int{"flash_fwd_ht": hopperFwdShared, "flash_bwd_dq_ht": hopperBwdShared, "flash_bwd_dkv_ht": hopperBwdShared} {
							if err := e.th.do(func() error { return e.fns[name].AllowSharedMemory(n) }); err != nil {
								t.Fatal(err)
							}
							e.shared[name] = n
						}
					}
					got := run(v.rows, v.split, v.hopper)
					e.flashTMA = tmaDefault
					fwd := fmt.Sprintf("%d-row forward, backward in one kernel", v.rows)
					switch {
					case v.tma:
						fwd = "Hopper kernels by tensor copies"
					case v.hopper && v.split:
						fwd = "Hopper kernels"
					case v.hopper:
						fwd = "Hopper kernels, backward in one kernel"
					case v.split:
						fwd = fmt.Sprintf("%d-row forward, backward in two kernels", v.rows)
					}
					if _, again := flash[fwd]; again {
						// The fused backward's sums across blocks keep one
						// order, and the Hopper kernels sum in registers
						// only: a second run gives the same bits (for the
						// Hopper kernels, with the other tiling of blocks).
						first := flash[fwd]
						for _, c := range []struct {
							name      string
							got, want []float32
						}{{"dq", got.dq, first.dq}, {"dk", got.dk, first.dk}, {"dv", got.dv, first.dv}} {
							if i := firstBitDiff(c.got, c.want); i >= 0 {
								t.Fatalf("%s, run again: %s[%d] = %g, first run %g", fwd, c.name, i, c.got[i], c.want[i])
							}
						}
						if !slices.Equal(got.dqb, first.dqb) || !slices.Equal(got.dkb, first.dkb) || !slices.Equal(got.dvb, first.dvb) {
							t.Fatalf("%s, run again: the bf16 gradients differ from the first run's", fwd)
						}
						continue
					}
					flash[fwd] = got
					// The bf16 copies the GEMMs read are the fp32 results
					// rounded to nearest even, value for value.
					for _, c := range []struct {
						name string
						f32  []float32
						bf   []uint16
					}{{"out", got.out, got.outb}, {"dv", got.dv, got.dvb}} {
						for i, x := range c.f32 {
							if want := model.ToBF16(x); c.bf[i] != want {
								t.Fatalf("%s, %s bf16 copy at %d: %#04x, want %#04x (the rounding of %g)", fwd, c.name, i, c.bf[i], want, x)
							}
						}
					}
					// dq and dk leave the kernels in bf16 already rotated
					// back (rope's inverse at each row's position): the fp32
					// results rotated here, to within the bf16 rounding of
					// values the kernel rotates with its own fused
					// multiply-adds.
					for _, c := range []struct {
						name  string
						f32   []float32
						bf    []uint16
						heads int
					}{{"dq", got.dq, got.dqb, H}, {"dk", got.dk, got.dkb, KV}} {
						want := slices.Clone(c.f32)
						pos := make([]int, len(want)/(c.heads*D))
						for r := range pos {
							pos[r] = r % T
						}
						model.RotateHalf(want, got.cos, got.sin, pos, c.heads, D, true)
						var big float64
						for _, w := range want {
							big = math.Max(big, math.Abs(float64(w)))
						}
						for i, w := range want {
							g := math.Float32frombits(uint32(c.bf[i]) << 16)
							// 2^-7 of the value (bf16 rounds to 2^-9) and
							// 1e-6 of the largest, for a sum that cancels.
							if d := math.Abs(float64(g - w)); d > math.Abs(float64(w))/128+big*1e-6 {
								t.Fatalf("%s, %s bf16 at %d (row %d): %g, want %g, the inverse rotation of the fp32 result", fwd, c.name, i, i/(c.heads*D), g, w)
							}
						}
					}
					for _, c := range []struct {
						name      string
						got, want []float32
					}{{"out", got.out, want.out}, {"dq", got.dq, want.dq}, {"dk", got.dk, want.dk}, {"dv", got.dv, want.dv}} {
						rel := maxRelErr(c.got, c.want)
						t.Logf("%s, %s (%s): max error %.3g of its largest value", fwd, c.name, e.Arch, rel)
						if !(rel <= 1e-2) {
							t.Errorf("%s, %s: flash differs from the straightforward kernels by %.3g of its largest value (limit 1e-2)", fwd, c.name, rel)
						}
					}
				}
				// flash_fwd128 does flash_fwd's arithmetic row for row (the
				// same key tiles in the same order): alike to within the
				// order the compiler may contract a multiply-add in, far
				// below what a wrong mask or tile would move.
				g64, g128 := flash["64-row forward, backward in two kernels"], flash["128-row forward, backward in two kernels"]
				// The two backward paths do the same products; the fused one
				// sums dvec's row and dq over key tiles in another order, and
				// dk and dv over heads and query tiles in another
				// interleaving: alike far below a wrong tile.
				fused := flash["128-row forward, backward in one kernel"]
				field := func(r result, name string) []float32 {
					return map[string][]float32{"out": r.out, "lse": r.lse, "dvec": r.dvec, "dq": r.dq, "dk": r.dk, "dv": r.dv}[name]
				}
				// alike holds the named results of got to want's, each within
				// limit of its largest value.
				alike := func(what string, limit float64, got, want result, names ...string) {
					for _, name := range names {
						rel := maxRelErr(field(got, name), field(want, name))
						t.Logf("%s (%s): %s %.3g of its largest value apart", what, e.Arch, name, rel)
						if !(rel <= limit) {
							t.Errorf("%s: %s %.3g of its largest value apart (limit %.0e)", what, name, rel, limit)
						}
					}
				}
				alike("one-kernel backward against two", 1e-5, fused, g128, "dvec", "dq", "dk", "dv")
				// The Hopper kernels take the same tiles in the same order
				// with the products on other tensor-core instructions: the
				// fp32 sums may round apart, and a probability may then
				// round to another bf16, far below a wrong tile or mask.
				// Their backward in one pass against their two kernels: the
				// same products, dq summed over key tiles across blocks and dk
				// and dv over the items in another order.
				if hopper {
					h := flash["Hopper kernels"]
					// The same tiles in the same shared memory, whoever copied
					// them: the same bits.
					alike("Hopper kernels by tensor copies against cp.async", 0, flash["Hopper kernels by tensor copies"], h,
						"out", "lse", "dvec", "dq", "dk", "dv")
					alike("Hopper kernels against flash.cu's", 2e-3, h, g128, "out", "lse", "dvec", "dq", "dk", "dv")
					alike("Hopper one-kernel backward against two", 1e-5, flash["Hopper kernels, backward in one kernel"], h, "dvec", "dq", "dk", "dv")
				}
				var lseDiff float64
				same := 0
				for i := range g64.lse {
					lseDiff = math.Max(lseDiff, math.Abs(float64(g128.lse[i]-g64.lse[i])))
					if g128.lse[i] == g64.lse[i] {
						same++
					}
				}
				outDiff := maxRelErr(g128.out, g64.out)
				t.Logf("128-row forward against 64-row (%s): lse equal at %d of %d rows, %.3g apart at most; out %.3g of its largest value apart",
					e.Arch, same, len(g64.lse), lseDiff, outDiff)
				if !(lseDiff <= 1e-4) {
					t.Errorf("lse: the 128-row forward differs from the 64-row one by up to %.3g (limit 1e-4)", lseDiff)
				}
				if !(outDiff <= 1e-5) {
					t.Errorf("out: the 128-row forward differs from the 64-row one by %.3g of its largest value (limit 1e-5)", outDiff)
				}
				names := []string{"flash_fwd", "flash_fwd128", "flash_bwd_dq", "flash_bwd_dkv", "flash_bwd_dvec", "flash_bwd", "flash_bwd_dq_final"}
				if hopper {
					names = append(names, "flash_fwd_h", "flash_fwd_ht", "flash_bwd_dq_h", "flash_bwd_dq_ht", "flash_bwd_dkv_h", "flash_bwd_dkv_ht", "flash_bwd_h")
				}
				for _, name := range names {
					r, err := e.fns[name].Resources()
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("%s (%s): %d registers, %d bytes of shared memory, %d of local memory (spills)", name, e.Arch, r.Registers, r.SharedBytes, r.LocalBytes)
				}
				counts := e.LaunchCounts()
				wantCounts := map[string]int{"flash_fwd": 1, "flash_fwd128": 3, "flash_bwd_dq": 2, "flash_bwd_dkv": 2,
					"flash_bwd_dvec": 2, "flash_bwd": 2, "flash_bwd_dq_final": 2, "attn_fwd": 1, "attn_bwd_q": 1, "attn_bwd_kv": 1}
				if hopper {
					// Two runs each of the two-kernel and the one-pass backward.
					wantCounts["flash_fwd_h"], wantCounts["flash_bwd_dq_h"], wantCounts["flash_bwd_dkv_h"] = 4, 2, 2
					wantCounts["flash_bwd_h"], wantCounts["flash_fwd_ht"], wantCounts["flash_bwd_dq_ht"], wantCounts["flash_bwd_dkv_ht"] = 2, 1, 1, 1
					wantCounts["flash_bwd_dvec"] += 2
					wantCounts["flash_bwd_dq_final"] += 2
				}
				for name, n := range wantCounts {
					if counts[name] != n {
						t.Fatalf("kernel %s launched %d times, want %d: %v", name, counts[name], n, counts)
					}
				}
			})
		}
	}
}

// flash_bwd, and the Hopper kernels, launch with the dynamic shared memory
// flash.cu and flash_sm90.cu size them for.
func TestFlashBackwardSharedMemory(t *testing.T) {
	src, err := sources.ReadFile("flash.cu")
	if err != nil {
		t.Fatal(err)
	}
	for _, def := range []string{"#define FT 64 ", "#define LDS 72 ", "#define TILE (FT * LDS)", "#define FLASH_BWD_SMEM (7 * TILE * 2)"} {
		if !strings.Contains(string(src), def) {
			t.Errorf("flash.cu has no %q: flashBwdShared (%d bytes) must follow its FLASH_BWD_SMEM", def, flashBwdShared)
		}
	}
	if flashBwdShared != 7*64*72*2 {
		t.Errorf("flashBwdShared = %d, want seven 64 x 72 bf16 tiles", flashBwdShared)
	}
	// The Hopper kernels' tiles, and their blocks' dynamic shared memory.
	h, err := sources.ReadFile("flash_sm90.cu")
	if err != nil {
		t.Fatal(err)
	}
	for def, n := range map[string]int{"#define SW_TILE 8192 ": hopperTile, "#define FLASH_H_FWD_SMEM (5 * SW_TILE + 1024)": hopperFwdShared,
		"#define FLASH_H_DQ_SMEM (6 * SW_TILE + 1024)": hopperBwdShared, "#define FLASH_H_DKV_SMEM (6 * SW_TILE + 1024)": hopperBwdShared,
		"#define FLASH_H_BWD_SMEM (9 * SW_TILE + 1024)": hopperFusedShared} {
		if !strings.Contains(string(h), def) {
			t.Errorf("flash_sm90.cu has no %q: the engine launches with %d bytes", def, n)
		}
	}
	if hopperTile != 8192 || hopperFwdShared != 5*8192+1024 || hopperBwdShared != 6*8192+1024 || hopperFusedShared != 9*8192+1024 {
		t.Errorf("the Hopper kernels' shared memory: tile %d, forward %d, backward %d, one-pass backward %d bytes; want flash_sm90.cu's",
			hopperTile, hopperFwdShared, hopperBwdShared, hopperFusedShared)
	}
}

// flashBackwardSplit launches flash.cu's two backward kernels or
// flash_sm90.cu's with one argument list, so each Hopper kernel must take
// the parameters of the flash.cu kernel it stands in for.
func TestHopperBackwardTakesFlashCuParameters(t *testing.T) {
	sigs := map[string][]paramKind{}
	for _, file := range []string{"flash.cu", "flash_sm90.cu"} {
		src, err := sources.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		ks, err := kernelSignatures(string(src))
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range ks {
			sigs[k.name] = k.params
		}
	}
	for sm80, h := range map[string]string{"flash_bwd_dq": "flash_bwd_dq_h", "flash_bwd_dkv": "flash_bwd_dkv_h", "flash_fwd": "flash_fwd_h",
		"flash_bwd": "flash_bwd_h"} {
		if sigs[sm80] == nil || !slices.Equal(sigs[sm80], sigs[h]) {
			t.Errorf("%s takes %v, %s %v: the engine launches both with one argument list", sm80, sigs[sm80], h, sigs[h])
		}
	}
}

// A bf16 training step at head_dim 64 launches the flash kernels and never
// the straightforward ones (and fp32 the reverse), so the parity checks
// above and the golden bf16 check exercise the path training takes; the
// forward is flash_fwd128 unless KILN_CUDA_FLASH_FWD=64 picks flash_fwd,
// and the backward flash_bwd_dq and flash_bwd_dkv unless
// KILN_CUDA_FLASH_BWD=fused picks flash_bwd_dvec, flash_bwd and
// flash_bwd_dq_final.
func TestTrainingStepTakesFlashPath(t *testing.T) {
	c, p, b := loadGolden(t, goldenDirs[1])
	if c.HeadDim != flashHeadDim {
		t.Fatalf("golden %s has head_dim %d, want %d", goldenDirs[1], c.HeadDim, flashHeadDim)
	}
	flashKernels := []string{"flash_fwd", "flash_fwd128", "flash_bwd_dq", "flash_bwd_dkv", "flash_bwd_dvec", "flash_bwd", "flash_bwd_dq_final",
		"flash_fwd_h", "flash_fwd_ht", "flash_bwd_dq_h", "flash_bwd_dq_ht", "flash_bwd_dkv_h", "flash_bwd_dkv_ht", "flash_bwd_h"}
	for _, v := range []struct{ prec, attn, fwd, bwd, tma string }{{"bf16", "", "", "", ""}, {"bf16", "", "", "fused", ""},
		{"bf16", "", "", "", "off"}, {"bf16", "", "", "fused", "off"}, {"bf16", "flash-sm80", "", "", ""}, {"bf16", "flash-sm80", "64", "", ""},
		{"bf16", "flash-sm80", "128", "split", ""}, {"bf16", "flash-sm80", "", "fused", ""}, {"fp32", "", "", "", ""},
		{"fp32", "", "64", "fused", ""}} {
		t.Run(v.prec+"/attention="+v.attn+"/fwd="+v.fwd+"/bwd="+v.bwd+"/tma="+v.tma, func(t *testing.T) {
			t.Setenv("KILN_CUDA_ATTENTION", v.attn)
			t.Setenv("KILN_CUDA_FLASH_FWD", v.fwd)
			t.Setenv("KILN_CUDA_FLASH_BWD", v.bwd)
			t.Setenv("KILN_CUDA_FLASH_TMA", v.tma)
			e := newEngine(t, c, model.Options{Precision: v.prec, MaxBatch: b.B, MaxSeq: b.T})
			if err := e.SetParams(p); err != nil {
				t.Fatal(err)
			}
			if err := e.ForwardBackward(b, 1); err != nil {
				t.Fatal(err)
			}
			n := e.LaunchCounts()
			want := map[string]int{"flash_fwd128": c.Layers, "flash_bwd_dq": c.Layers, "flash_bwd_dkv": c.Layers}
			// A compute capability 9.0 device's native build runs the
			// Hopper kernels unless flash.cu's are asked for.
			_, hopper := e.fns["flash_fwd_h"]
			hopper = hopper && v.attn == ""
			if hopper {
				want = map[string]int{"flash_fwd_h": c.Layers, "flash_bwd_dq_h": c.Layers, "flash_bwd_dkv_h": c.Layers}
			}
			if v.fwd == "64" {
				delete(want, "flash_fwd128")
				want["flash_fwd"] = c.Layers
			}
			// Their tiles copied by the tensor memory accelerator unless
			// KILN_CUDA_FLASH_TMA=off (or the driver makes no tensor maps).
			if v.tma != "off" && hopper && e.dv.D.TensorMaps() {
				want = map[string]int{"flash_fwd_ht": c.Layers, "flash_bwd_dq_ht": c.Layers, "flash_bwd_dkv_ht": c.Layers}
			}
			if v.bwd == "fused" {
				delete(want, "flash_bwd_dq")
				delete(want, "flash_bwd_dkv")
				delete(want, "flash_bwd_dq_h")
				delete(want, "flash_bwd_dkv_h")
				delete(want, "flash_bwd_dq_ht")
				delete(want, "flash_bwd_dkv_ht")
				one := "flash_bwd"
				if hopper {
					one = "flash_bwd_h"
				}
				want["flash_bwd_dvec"], want[one], want["flash_bwd_dq_final"] = c.Layers, c.Layers, c.Layers
			}
			naive := n["attn_fwd"] == c.Layers && n["attn_bwd_q"] == c.Layers && n["attn_bwd_kv"] == c.Layers
			if v.prec == "bf16" {
				for _, k := range flashKernels {
					if n[k] != want[k] {
						t.Errorf("bf16 step: %s launched %d times, want %d (launches %v)", k, n[k], want[k], n)
					}
				}
				if n["attn_fwd"]+n["attn_bwd_q"]+n["attn_bwd_kv"] != 0 {
					t.Errorf("bf16 step: the straightforward attention ran beside the flash kernels: %v", n)
				}
			}
			if v.prec == "fp32" {
				flash := 0
				for _, k := range flashKernels {
					flash += n[k]
				}
				if !naive || flash != 0 {
					t.Errorf("fp32 step: want the straightforward attention once per layer and no flash kernels, launches %v", n)
				}
			}
		})
	}
}

// A bf16 step whose attention forward is flash_fwd (KILN_CUDA_FLASH_FWD=64)
// agrees with transformers on the head_dim 64 golden model as TestGoldenBF16
// holds the default path (flash_fwd128) to, with the native build and the
// sm_80 one.
func TestGoldenBF16FlashForward64(t *testing.T) {
	skipWithoutGPU(t)
	for _, force := range []string{"0", "1"} {
		t.Run("sm80="+force, func(t *testing.T) {
			t.Setenv("KILN_CUDA_FORCE_SM80", force)
			t.Setenv("KILN_CUDA_ATTENTION", "flash-sm80")
			t.Setenv("KILN_CUDA_FLASH_FWD", "64")
			tol := BF16Tolerances
			verify(t, goldenDirs[1], "bf16", &tol)
		})
	}
}

// The pilot's shape (small, batch 8 x 1024, bf16) fits a 12 GB card: peak
// allocated memory after a full step stays under 11 GiB.
func TestPilotPeakMemory(t *testing.T) {
	c := model.Presets["small"]
	e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: 8, MaxSeq: 1024})
	if err := e.SetParams(model.InitParams(c, 1)); err != nil {
		t.Fatal(err)
	}
	m := stepOnce(t, e, patternBatch(c, 8, 1024))
	peak := e.Memory().PeakAllocated
	t.Logf("small 8x1024 bf16: peak allocated %.2f GiB, loss %.4f", gib(peak), m.Loss)
	if gib(peak) >= 11 {
		t.Errorf("peak allocated %.2f GiB, want under 11 GiB", gib(peak))
	}
	if math.IsNaN(m.Loss) || m.Loss <= 0 {
		t.Errorf("loss %v after one step", m.Loss)
	}
}

// BenchmarkFlashBackward times the flash attention backward of one layer
// alone at small's shape (B 32 x T 1024, 8 query heads over 4 key/value
// heads), in two kernels (split) and in one (fused: flash_bwd_dvec,
// flash_bwd, flash_bwd_dq_final), on the activations of one forward pass.
func BenchmarkFlashBackward(b *testing.B) {
	c := model.Presets["small"]
	const B, T = 32, 1024
	batch := patternBatch(c, B, T)
	for _, v := range []string{"split", "fused", "hopper", "hopper-fused"} {
		b.Run(v, func(b *testing.B) {
			// flash.cu's two backward paths, or flash_sm90.cu's on a
			// Hopper GPU (elsewhere the engine runs flash.cu's).
			switch v {
			case "hopper":
				b.Setenv("KILN_CUDA_ATTENTION", "flash")
			case "hopper-fused":
				b.Setenv("KILN_CUDA_ATTENTION", "flash")
				b.Setenv("KILN_CUDA_FLASH_BWD", "fused")
			default:
				b.Setenv("KILN_CUDA_ATTENTION", "flash-sm80")
				b.Setenv("KILN_CUDA_FLASH_BWD", v)
			}
			e := newEngine(b, c, model.Options{Precision: "bf16", MaxBatch: B, MaxSeq: T})
			if err := e.SetParams(model.InitParams(c, 1)); err != nil {
				b.Fatal(err)
			}
			scale := float32(1 / math.Sqrt(flashHeadDim))
			bwd := func() error {
				if err := e.flashBackward(0, B, T, scale); err != nil {
					return err
				}
				return e.dv.Synchronize()
			}
			if err := e.th.do(func() error {
				if err := e.stageIDs(batch.Inputs); err != nil {
					return err
				}
				if err := e.forward(batch); err != nil {
					return err
				}
				// The attention output stands in for its gradient.
				if err := e.dv.Copy(e.a.dyb, e.a.yb[0], int64(B*T*c.Heads*flashHeadDim)*2); err != nil {
					return err
				}
				return bwd()
			}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := e.th.do(bwd); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/layer")
		})
	}
}
