package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

func init() {
	var tokFile, in, out, dtype string
	tok := &cobra.Command{
		Use:   "tokenize [--tokenizer NAME | --tokenizer-file FILE] --in TEXT --out IDS [--dtype u16|u32]",
		Short: "Encode a text file into raw little-endian token ids",
		Long: `tokenize encodes TEXT with a tokenizer and writes the ids as raw
little-endian u16 or u32 values, for inspection and interchange. The
tokenizer is a tokenizer.json given with --tokenizer-file, or else the
published one --tokenizer names (default KILN_TOKENIZER; 'sched tokenizers'
lists them). u16 is refused when the vocabulary has more than 65536 tokens.`,
		Args: exactArgs(0, "no positional arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if in == "" || out == "" {
				return badInput("tokenize needs --in and --out; see 'sched tokenize --help'")
			}
			if err := checkNotAnInput(out, "ids", "--in", in); err != nil {
				return err
			}
			if err := checkNotAnInput(out, "ids", "--tokenizer-file", tokFile); err != nil {
				return err
			}
			// The live heap of this command is the tokenizer (tens of
			// megabytes of small objects) and a few reused buffers per
			// core: the default GC target collected and rescanned the
			// tokenizer several times, while it loaded and after, for
			// garbage that is not there.
			defer debug.SetGCPercent(debug.SetGCPercent(400))
			tk, label, err := loadTokenizerFor(cmd, tokFile)
			if err != nil {
				return err
			}
			return runTokenize(cmd.Context(), cmd.ErrOrStderr(), tk, label, in, out, dtype)
		},
	}
	tok.Flags().StringVar(&tokFile, "tokenizer-file", "", "tokenizer.json to encode with, instead of the tokenizer --tokenizer names")
	tok.Flags().StringVar(&in, "in", "", "text file to encode (required)")
	tok.Flags().StringVar(&out, "out", "", "file to write the ids to (required)")
	tok.Flags().StringVar(&dtype, "dtype", "u16", "id width: u16 or u32")
	rootCmd.AddCommand(tok)

	var inputs []string
	var opts tokenizer.TrainOptions
	var special []string
	var trainOut string
	train := &cobra.Command{
		Use:   "train --in FILES... --vocab 16384 --out tokenizer.json",
		Short: "Train a byte-level BPE vocabulary on text files",
		Args:  exactArgs(0, "no positional arguments (pass files with --in)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(special) == 0 {
				return badInput("--special names no token: give at least the end-of-text token (such as <|endoftext|>), which ends each document in a token store")
			}
			opts.SpecialTokens = special
			// Zero is the library's "default", which a size typed on the
			// command line never means.
			if opts.VocabSize <= 0 {
				return badInput("--vocab %d: give the vocabulary's size, at least 257 (256 byte symbols and the end-of-text token; default 16384)", opts.VocabSize)
			}
			if opts.MinFrequency < 1 {
				return badInput("--min-frequency %d: give how many times a pair must occur to be merged, at least 1 (default 2)", opts.MinFrequency)
			}
			return runTokenizerTrain(cmd.Context(), cmd.ErrOrStderr(), inputs, trainOut, opts)
		},
	}
	train.Flags().StringSliceVar(&inputs, "in", nil, "text files to learn from (repeat or comma-separate; required)")
	train.Flags().IntVar(&opts.VocabSize, "vocab", 16384, "vocabulary size, counting special tokens and the 256 byte symbols")
	train.Flags().Int64Var(&opts.MinFrequency, "min-frequency", 2, "do not merge pairs seen fewer times")
	train.Flags().StringSliceVar(&special, "special", []string{"<|endoftext|>"}, "special tokens, first ids in order (the first end-of-text name is the EOS)")
	train.Flags().StringVar(&opts.Pattern, "pattern", "gpt4", "pre-tokenizer: gpt4 (GPT-4/Llama-3 split) or gpt2")
	train.Flags().StringVar(&trainOut, "out", "tokenizer.json", "file to write")
	group := &cobra.Command{Use: "tokenizer", Short: "Tokenizer vocabularies: train"}
	group.AddCommand(train)
	rootCmd.AddCommand(group)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// checkTokenizerFlag refuses a path given to the global --tokenizer, which
// names a published tokenizer: a tokenizer.json file goes to
// --tokenizer-file.
func checkTokenizerFlag(cmd *cobra.Command) error {
	v, given := flagValue(cmd, "tokenizer")
	if given && (strings.ContainsAny(v, `/\`) || strings.HasSuffix(v, ".json")) {
		return badInput("--tokenizer %s: --tokenizer takes a published tokenizer's name ('sched tokenizers' lists them); give a tokenizer.json file as --tokenizer-file %s", v, v)
	}
	return nil
}

// loadTokenizerFor loads the tokenizer a command is given: the file
// --tokenizer-file names, or else the published one --tokenizer
// (KILN_TOKENIZER) names, from the catalog. label names it in messages.
func loadTokenizerFor(cmd *cobra.Command, file string) (tk *tokenizer.Tokenizer, label string, err error) {
	if err := checkTokenizerFlag(cmd); err != nil {
		return nil, "", err
	}
	if file != "" {
		if _, given := flagValue(cmd, "tokenizer"); given {
			return nil, "", badInput("give --tokenizer NAME (a published tokenizer) or --tokenizer-file FILE, not both")
		}
		if tk, err = tokenizer.Load(file); err != nil {
			return nil, "", badInput("--tokenizer-file %s: %v", file, err)
		}
		return tk, file, nil
	}
	cfg, err := loadConfig(cmd)
	if err != nil {
		return nil, "", err
	}
	objects, err := openStore(cmd.Context(), cfg)
	if err != nil {
		return nil, "", err
	}
	if _, tk, err = catalog.New(objects, cfg.DataDir).Resolve(cmd.Context(), cfg.Tokenizer); err != nil {
		return nil, "", err
	}
	return tk, "tokenizer " + cfg.Tokenizer, nil
}

func runTokenize(ctx context.Context, errOut io.Writer, tk *tokenizer.Tokenizer, label, in, out, dtype string) error {
	width := 0
	switch dtype {
	case "u16":
		width = 2
	case "u32":
		width = 4
	default:
		return badInput("--dtype %q is not u16 or u32", dtype)
	}
	if width == 2 && tk.VocabSize() > 1<<16 {
		return badInput("%s has %d tokens, more than the 65536 that --dtype u16 holds; use --dtype u32", label, tk.VocabSize())
	}
	src, err := os.Open(in)
	if err != nil {
		return badInput("tokenize: cannot open --in: %v (name a readable text file)", err)
	}
	if err := checkOut(out); err != nil {
		return err
	}
	defer src.Close()
	var r io.Reader = src
	size := int64(-1) // the text's bytes, where --in is a regular file
	st, err := src.Stat()
	if err == nil && st.IsDir() {
		return badInput("tokenize: --in %s is a directory; name one text file (join several with cat first)", in)
	}
	if err == nil && st.Mode().IsRegular() {
		size = st.Size()
	}
	if err == nil && isTerminal(errOut) {
		bar := progressbar.DefaultBytes(st.Size(), "tokenize")
		defer bar.Finish()
		if st.Mode().IsRegular() {
			r = progressFile{src, bar}
		} else {
			r = io.TeeReader(src, bar)
		}
	}
	var n int64
	start := time.Now()
	err = writeOutput(out, func(dst io.Writer) error {
		// Unbuffered: the ids come in pieces of hundreds of kilobytes, which
		// a buffer would only copy once more.
		var err error
		if n, err = tk.EncodeReaderTo(ctx, r, dst, width); err != nil {
			return fmt.Errorf("%s -> %s: %w", in, out, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("tokenize: %w", err)
	}
	took := time.Since(start)
	if size < 0 {
		fmt.Fprintf(errOut, "wrote %d ids (%s) to %s in %s\n", n, dtype, out, took.Round(time.Millisecond))
		return nil
	}
	fmt.Fprintf(errOut, "wrote %d ids (%s) to %s: %s of text in %s, %s\n", n, dtype, out,
		formatBytes(size), took.Round(time.Millisecond), formatRate(float64(size)/max(took.Seconds(), 1e-9), "B"))
	return nil
}

// progressFile is the --in file counting what is read on the progress bar.
// It keeps the file's ReadAt and Seek, so that the encoder's workers still
// read their pieces of it at once, at their offsets.
type progressFile struct {
	*os.File
	bar *progressbar.ProgressBar
}

func (p progressFile) Read(b []byte) (int, error) {
	n, err := p.File.Read(b)
	_ = p.bar.Add(n)
	return n, err
}

func (p progressFile) ReadAt(b []byte, off int64) (int, error) {
	n, err := p.File.ReadAt(b, off)
	_ = p.bar.Add(n)
	return n, err
}

func runTokenizerTrain(ctx context.Context, errOut io.Writer, inputs []string, out string, opts tokenizer.TrainOptions) error {
	if len(inputs) == 0 {
		return badInput("tokenizer train needs --in FILES; see 'sched tokenizer train --help'")
	}
	// Before the training, not after it: a mistyped --out must not cost
	// the minutes the training takes.
	if err := checkNotAnInput(out, "tokenizer", "--in", inputs...); err != nil {
		return err
	}
	if err := checkOut(out); err != nil {
		return err
	}
	var readers []io.Reader
	var total int64
	for _, p := range inputs {
		f, err := os.Open(p)
		if err != nil {
			return badInput("tokenizer train: cannot open --in: %v (name readable text files: --in repeated or comma-separated)", err)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil {
			if st.IsDir() {
				return badInput("tokenizer train: --in %s is a directory; name its text files (--in repeated or comma-separated)", p)
			}
			total += st.Size()
		}
		readers = append(readers, bufio.NewReaderSize(f, 1<<20))
	}
	if isTerminal(errOut) {
		var bar *progressbar.ProgressBar
		stageNow := ""
		opts.Progress = func(stage string, done, max int64) {
			if stage != stageNow {
				if bar != nil {
					_ = bar.Finish()
				}
				stageNow = stage
				if stage == "count" {
					bar = progressbar.DefaultBytes(total, "counting words")
				} else {
					bar = progressbar.Default(max, "learning merges")
				}
			}
			_ = bar.Set64(done)
		}
		defer func() {
			if bar != nil {
				_ = bar.Finish()
			}
		}()
	}
	data, err := tokenizer.Train(ctx, readers, opts)
	if err != nil {
		return err
	}
	if err := writeOutput(out, func(w io.Writer) error { _, err := w.Write(data); return err }); err != nil {
		return fmt.Errorf("tokenizer train: %w", err)
	}
	fmt.Fprintf(errOut, "wrote %s\n", out)
	if t, err := tokenizer.Parse(data); err == nil {
		if msg := tokenizer.Shortfall(t.VocabSize(), opts.VocabSize, opts.MinFrequency); msg != "" {
			fmt.Fprintf(errOut, "warning: %s\n", msg)
		}
	}
	return nil
}

// requireEOS refuses a tokenizer with no end-of-text token for work that
// separates documents with it (token stores), naming the file and what to
// add.
func requireEOS(path string, tk *tokenizer.Tokenizer) error {
	if _, ok := tk.EOS(); ok {
		return nil
	}
	return badInput("tokenizer %s has no end-of-text token, which separates documents in a token store: add \"<|endoftext|>\" (or </s>) to its added_tokens with \"special\": true, or train one with 'sched tokenizer train --special \"<|endoftext|>\"'", path)
}

// checkOut refuses, as bad input, an --out that cannot be written: a
// directory, or a file in a directory that does not exist or that this
// process may not write to.
func checkOut(out string) error {
	if st, err := os.Stat(out); err == nil {
		if st.IsDir() {
			return badInput("--out %s is a directory; name a file to write", out)
		}
		if !st.Mode().IsRegular() {
			return nil // a device or a pipe, written in place
		}
	}
	dir := filepath.Dir(out)
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return badInput("--out %s: its directory %s does not exist; make it first (mkdir -p %s)", out, dir, dir)
	case err != nil:
		return badInput("--out %s: %v", out, err)
	case !st.IsDir():
		return badInput("--out %s: %s is not a directory", out, dir)
	}
	probe, err := os.CreateTemp(dir, filepath.Base(out)+".tmp*")
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return badInput("--out %s: cannot write in %s (%v); name a file in a directory you can write to", out, dir, err)
	}
	probe.Close()
	return os.Remove(probe.Name())
}

// checkNotAnInput refuses an --out that is one of the files flag names
// (paths; an empty one is skipped), by any path to it, a symbolic or a hard
// link included: the output is renamed over its name, and the text or
// tokenizer there would be gone. what names the output in the message.
func checkNotAnInput(out, what, flag string, paths ...string) error {
	ost, err := os.Stat(out)
	if err != nil {
		return nil // not there yet: nothing to lose (checkOut judges the rest)
	}
	for _, p := range paths {
		if ist, err := os.Stat(p); p != "" && err == nil && os.SameFile(ost, ist) {
			return badInput("--out %s is the file %s %s names: the %s would replace it; name another file for --out", out, flag, p, what)
		}
	}
	return nil
}

// writeOutput has write fill the file out. A regular file (or a new one) is
// written beside its final name and renamed over it, so that a failed run
// never leaves a truncated file under that name; it is readable by all, as
// os.WriteFile's 0644 would leave it (a temporary file is made 0600).
// Anything else (a device such as /dev/null, a named pipe) is written in
// place: renaming over it would replace the device with a file.
func writeOutput(out string, write func(io.Writer) error) error {
	if st, err := os.Stat(out); err == nil && !st.Mode().IsRegular() {
		if st.IsDir() {
			return badInput("%s is a directory; name a file to write", out)
		}
		f, err := os.OpenFile(out, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		if err := write(f); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	dst, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(dst.Name())
	if err := dst.Chmod(0o644); err != nil {
		dst.Close()
		return err
	}
	if err := write(dst); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	return os.Rename(dst.Name(), out)
}
