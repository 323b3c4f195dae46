package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kiln-lm/kiln/internal/shell"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
)

// outHelp is what both commands' help says of --out.
const outHelp = `The output is written beside --out and renamed over it, so that a
failed run never leaves a part-written file there. A file already at
--out is replaced only with --force, and never one that kiln manages,
--force or not: a file of a token store (a directory holding its
manifest.json) or of a training checkpoint (a directory holding its
trainer_state.json), or a tokenizer.json a catalog publishes: the data
directory's ('sched tokenizers' lists them), or any other's
(<data dir>/tokenizers/NAME or <data dir>/objects/tokenizers/NAME). A device or a pipe (/dev/null)
is written in place, as is /dev/stdout whatever it leads to (a file the
shell redirected it to included). '-' is refused: read standard input with
--in /dev/stdin, and pipe or redirect the output with --out /dev/stdout.`

func init() {
	var tokFile, in, out, dtype string
	var force bool
	tok := &cobra.Command{
		Use:   "tokenize [--tokenizer NAME | --tokenizer-file FILE] --in TEXT --out IDS [--dtype u16|u32] [--force]",
		Short: "Encode a text file into raw little-endian token ids",
		Long: `tokenize encodes TEXT with a tokenizer and writes the ids as raw
little-endian u16 or u32 values, for inspection and interchange. The
tokenizer is a tokenizer.json given with --tokenizer-file, or else the
published one --tokenizer names (default KILN_TOKENIZER; 'sched tokenizers'
lists them). u16 is refused when the vocabulary has more than 65536 tokens.

TEXT is read as UTF-8 text, to its end, a pipe's or /dev/stdin's too: a
NUL byte, which no text holds, ends the command (exit 2) as binary data,
such as a device (/dev/zero, /dev/urandom), an image or text in UTF-16.

` + outHelp,
		Args: exactArgs(0, "no positional arguments"),
		Example: `  sched tokenize --in main.go --out main.ids
  sched tokenize --tokenizer-file tokenizer.json --in corpus.txt --out corpus.u32 --dtype u32
  echo 'func main() {}' | sched tokenize --in /dev/stdin --out /dev/stdout | od -An -tu2`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if in == "" || out == "" {
				return badInput("tokenize needs --in and --out; see 'sched tokenize --help'")
			}
			// Before anything loads: the width is the command line's.
			if _, err := idWidth(dtype); err != nil {
				return err
			}
			if err := checkNoDash("tokenize", out, in); err != nil {
				return err
			}
			if err := checkNotAnInput(out, "ids", "--in", in); err != nil {
				return err
			}
			if err := checkNotAnInput(out, "ids", "--tokenizer-file", tokFile); err != nil {
				return err
			}
			// Before the configuration, which would refuse a path given
			// to --tokenizer less helpfully.
			if err := checkTokenizerFlag(cmd); err != nil {
				return err
			}
			policy, err := outPolicyFor(cmd, force)
			if err != nil {
				return err
			}
			// Before the tokenizer loads: a refused --out costs nothing.
			if err := policy.check(commandContext(cmd), out); err != nil {
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
	noEmpty(tok.Flags(), "tokenizer-file", "a tokenizer.json", "the published tokenizer --tokenizer (KILN_TOKENIZER) names")
	tok.Flags().StringVar(&in, "in", "", "text file to encode (required; /dev/stdin reads standard input)")
	tok.Flags().StringVar(&out, "out", "", "file to write the ids to (required; /dev/stdout to pipe them on)")
	tok.Flags().StringVar(&dtype, "dtype", "u16", "id width: u16 or u32")
	tok.Flags().BoolVar(&force, "force", false, "replace a file already at --out (never a token store's file or a published tokenizer)")
	rootCmd.AddCommand(tok)

	var inputs []string
	var opts tokenizer.TrainOptions
	var special []string
	var trainOut string
	var trainForce bool
	train := &cobra.Command{
		Use:   "train --in FILES... --vocab 16384 --out tokenizer.json [--force]",
		Short: "Train a byte-level BPE vocabulary on text files",
		Long: `train learns a byte-level BPE vocabulary from the text files --in names
and writes it as a tokenizer.json. Written to
<data dir>/tokenizers/NAME/tokenizer.json, a new NAME becomes known to this
machine as a published tokenizer.

The files are read as UTF-8 text, each to its end, a pipe's or
/dev/stdin's too: a NUL byte, which no text holds, ends the command
(exit 2) as binary data, such as a device (/dev/zero, /dev/urandom), an
image or text in UTF-16.

` + outHelp,
		Args: exactArgs(0, "no positional arguments (pass files with --in)"),
		Example: `  sched tokenizer train --in a.go,b.go --vocab 4096 --out tokenizer.json
  sched tokenizer train --in corpus.txt --vocab 16384 --pattern gpt2 --out /tmp/gpt2-style.json`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(special) == 0 {
				return badInput("--special names no token: give at least the end-of-text token (such as <|endoftext|>), which ends each document in a token store")
			}
			if !slices.ContainsFunc(special, tokenizer.IsEOSName) {
				return badInput("--special %s: none is an end-of-text token (<|endoftext|>, </s>, <eos>, ...), which ends each document in a token store, so no ingest could use the tokenizer: add <|endoftext|>", strings.Join(special, ","))
			}
			opts.SpecialTokens = special
			// Zero is the library's "default", which a size typed on the
			// command line never means; the bounds are sched enqueue
			// tokenizer's, its special tokens counted.
			if least := 256 + len(special) + 1; opts.VocabSize < least || opts.VocabSize > maxVocab {
				specials := fmt.Sprintf("the %d special tokens", len(special))
				if len(special) == 1 {
					specials = "the special token " + special[0]
				}
				return badInput("--vocab %d: give a vocabulary of %d to %d ids (the 256 byte symbols, %s and at least one merge; 16384 is the plan's)",
					opts.VocabSize, least, maxVocab, specials)
			}
			if opts.MinFrequency < 1 {
				return badInput("--min-frequency %d: give how many times a pair must occur to be merged, at least 1 (default 2)", opts.MinFrequency)
			}
			if err := checkNoDash("tokenizer train", trainOut, inputs...); err != nil {
				return err
			}
			if opts.Pattern != "gpt4" && opts.Pattern != "gpt2" {
				// Before the input is read: the trainer's own refusal
				// comes after it, naming no flag.
				return badInput("--pattern %q: give gpt4 (the GPT-4/Llama-3 split) or gpt2", opts.Pattern)
			}
			policy, err := outPolicyFor(cmd, trainForce)
			if err != nil {
				return err
			}
			return runTokenizerTrain(commandContext(cmd), cmd.ErrOrStderr(), inputs, trainOut, policy, opts)
		},
	}
	train.Flags().StringSliceVar(&inputs, "in", nil, "text files to learn from (repeat or comma-separate; required)")
	train.Flags().IntVar(&opts.VocabSize, "vocab", 16384, "vocabulary size, counting special tokens and the 256 byte symbols")
	train.Flags().Int64Var(&opts.MinFrequency, "min-frequency", 2, "do not merge pairs seen fewer times")
	train.Flags().StringSliceVar(&special, "special", []string{"<|endoftext|>"}, "special tokens, first ids in order (the first end-of-text name is the EOS)")
	train.Flags().StringVar(&opts.Pattern, "pattern", "gpt4", "pre-tokenizer: gpt4 (GPT-4/Llama-3 split) or gpt2")
	noEmpty(train.Flags(), "pattern", "gpt4 or gpt2", "gpt4")
	train.Flags().StringVar(&trainOut, "out", "tokenizer.json", "file to write")
	train.Flags().BoolVar(&trainForce, "force", false, "replace a file already at --out (never a token store's file or a published tokenizer)")
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
			return nil, "", badInputError{onPath("--tokenizer-file", file, err)}
		}
		if err := requireAllBytes("--tokenizer-file "+file, tk); err != nil {
			return nil, "", err
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

// idWidth is the bytes of an id that --dtype names.
func idWidth(dtype string) (int, error) {
	switch dtype {
	case "u16":
		return 2, nil
	case "u32":
		return 4, nil
	}
	return 0, badInput("--dtype %q is not u16 or u32: give u16 (vocabularies of up to 65536 ids) or u32", dtype)
}

func runTokenize(ctx context.Context, errOut io.Writer, tk *tokenizer.Tokenizer, label, in, out, dtype string) (err error) {
	defer func() { err = stoppedBy(ctx, "tokenize", out, err) }()
	width, err := idWidth(dtype)
	if err != nil {
		return err
	}
	if width == 2 && tk.VocabSize() > 1<<16 {
		return badInput("%s has %d tokens, more than the 65536 that --dtype u16 holds; use --dtype u32", label, tk.VocabSize())
	}
	src, err := openInput(ctx, in)
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
	// Read as text: a NUL byte ends it (tokenizer_input.go).
	if f, ok := r.(fileText); ok && size >= 0 {
		r = newTextFile("tokenize", in, f)
	} else {
		r = newTextStream("tokenize", in, r)
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
	if bin := (*binaryInputError)(nil); errors.As(err, &bin) {
		return bin // whole: it names the command and --in
	}
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

func runTokenizerTrain(ctx context.Context, errOut io.Writer, inputs []string, out string, policy outPolicy, opts tokenizer.TrainOptions) (err error) {
	defer func() { err = stoppedBy(ctx, "tokenizer train", out, err) }()
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
	regular := true // every input a file whose size says what it holds
	for _, p := range inputs {
		if p == "" {
			return badInput("tokenizer train: --in %s names an empty file name (two commas, or one at an end): name readable text files, --in repeated or comma-separated", strings.Join(inputs, ","))
		}
		f, err := openInput(ctx, p)
		if err != nil {
			return badInput("tokenizer train: cannot open --in: %v (name readable text files: --in repeated or comma-separated)", err)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil {
			if st.IsDir() {
				return badInput("tokenizer train: --in %s is a directory; name its text files (--in repeated or comma-separated)", p)
			}
			total += st.Size()
			regular = regular && st.Mode().IsRegular()
		}
		readers = append(readers, bufio.NewReaderSize(newTextStream("tokenizer train", p, f), 1<<20))
	}
	if regular && total == 0 {
		// It would learn no merge, and write a tokenizer of the bytes
		// alone, fewer ids than any vocabulary allowed.
		return badInput("tokenizer train: --in %s holds no text: name files of the text to learn the vocabulary from", strings.Join(inputs, ","))
	}
	if err := policy.check(ctx, out); err != nil {
		return err
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
	if bin := (*binaryInputError)(nil); errors.As(err, &bin) {
		return bin // without the trainer's "read input N", which names no file
	}
	if err != nil {
		return err
	}
	trained, perr := tokenizer.Parse(data)
	if perr == nil && trained.VocabSize() <= 256+len(opts.SpecialTokens) {
		// The byte symbols alone encode a byte a token: no size the
		// command takes (one merge at least) would have made it of use.
		return badInput("tokenizer train: --in %s: %s", strings.Join(inputs, ","), tokenizer.NoMerge(opts.MinFrequency))
	}
	// Again: in the minutes the training took, a file may have come to
	// --out (a tokenizer published by that name, say).
	if err := policy.check(ctx, out); err != nil {
		return err
	}
	if err := writeOutput(out, func(w io.Writer) error { _, err := w.Write(data); return err }); err != nil {
		return fmt.Errorf("tokenizer train: %w", err)
	}
	fmt.Fprintf(errOut, "wrote %s\n", out)
	if perr == nil {
		if msg := tokenizer.Shortfall(trained.VocabSize(), opts.VocabSize, opts.MinFrequency); msg != "" {
			fmt.Fprintf(errOut, "warning: %s\n", msg)
		}
	}
	return nil
}

// requireAllBytes refuses, for encoding text, a tokenizer that would drop
// some bytes of it without a word (tokenizer.DroppedBytes): a token store
// made with it would lack every one of them.
func requireAllBytes(label string, tk *tokenizer.Tokenizer) error {
	dropped := tk.DroppedBytes()
	if len(dropped) == 0 {
		return nil
	}
	return badInput("%s: its vocabulary lacks the byte-level symbols of %d of the 256 bytes (the first: byte %#02x, symbol %q) and it has no unk_token, so text holding them would be dropped from its encodings: give a tokenizer whose vocabulary holds all 256 (every byte-level BPE that kiln or HF tokenizers trains does)",
		label, len(dropped), dropped[0], tokenizer.ByteSymbol(dropped[0]))
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
// process may not write to. An empty one is outPolicy.check's to refuse,
// which both commands run before any work.
func checkOut(out string) error {
	if _, ok := descriptorOf(out); ok {
		return nil // this process's own descriptor, written in place
	}
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
		return badInput("--out %s: its directory %s does not exist; make it first (mkdir -p %s)", out, dir, shell.Quote(dir))
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

// checkNoDash refuses '-' as --out or as one of the --in files: these
// commands name files only, so '-' was a file of that name in the working
// directory, written or read where standard output or input was meant.
// The devices /dev/stdout and /dev/stdin are files that do what '-' would.
func checkNoDash(command, out string, in ...string) error {
	if out == "-" {
		return badInput("--out -: %s writes files, and '-' would be a file named '-' here; to write to standard output, through a pipe, give --out /dev/stdout", command)
	}
	if slices.Contains(in, "-") {
		return badInput("--in -: %s reads files, and '-' would be a file named '-' here; to read standard input, give --in /dev/stdin", command)
	}
	return nil
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
	if fd, ok := descriptorOf(out); ok {
		// Standard output redirected to a file is a regular file too:
		// renamed over, /dev/stdout itself would be replaced (as root)
		// and the file left empty. Written through the descriptor, it
		// gets the bytes where the shell put it (appended after >>).
		return write(os.NewFile(fd, out))
	}
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
	// On disk before the rename: a crash just after it must leave the
	// whole new file under the name, not an empty one where the old was.
	if err := dst.Sync(); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	return os.Rename(dst.Name(), out)
}

// commandContext is cmd's context, or the background where cobra was run
// without one.
func commandContext(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

// outPolicy says which existing file an --out may replace: one kiln
// manages never, any other regular file only with force.
type outPolicy struct {
	force bool
	// cfg locates the files kiln manages: the token stores under
	// <data dir>/tokens and the catalog's tokenizers. With no data
	// directory only the --out's own directory is looked at.
	cfg scheduler.Config
}

// outPolicyFor is the policy of a command's --force and configuration.
func outPolicyFor(cmd *cobra.Command, force bool) (outPolicy, error) {
	cfg, err := loadConfig(cmd)
	if err != nil {
		return outPolicy{}, err
	}
	return outPolicy{force: force, cfg: cfg}, nil
}

// check refuses, as bad input, an empty --out, an --out that would replace
// a file kiln manages (a token store's; a training checkpoint's, which a
// resume would find damaged; or a published tokenizer: stores and runs
// name it by its sha256, and would lose it or change meaning), and any
// other existing regular file unless --force was given. A device or a pipe
// is written in place, so nothing is replaced; a directory is checkOut's
// to refuse.
func (p outPolicy) check(ctx context.Context, out string) error {
	if out == "" {
		// The output would be written in the working directory and its
		// rename onto "" fail, after all the work.
		return badInput(`--out "" names no file; give the file to write`)
	}
	st, err := os.Stat(out)
	if err == nil && !st.Mode().IsRegular() {
		return nil
	}
	if err != nil {
		st = nil // a new file (or one checkOut refuses)
	}
	// The store as the path names it, else where its links lead.
	real := resolvePath(out)
	for _, m := range managedDirs {
		dir, ok := holding(filepath.Clean(out), m.is)
		if !ok {
			dir, ok = holding(real, m.is)
		}
		if !ok {
			continue
		}
		if st == nil {
			return badInput("--out %s is inside %s %s, whose files only %s writes; write to another path (--force does not change this)", out, m.what, dir, m.writer)
		}
		return badInput("--out %s is %s %s's file: replacing it would %s, so it is refused even with --force; write to another path", out, m.what, dir, m.harm)
	}
	if p.cfg.DataDir != "" {
		if st != nil {
			if dir, ok := p.storeFileLinkedAs(st); ok {
				return badInput("--out %s is token store %s's file (a link to it): replacing it would break the store, so it is refused even with --force; write to another path", out, dir)
			}
		}
		if err := p.checkNotPublished(ctx, out, real, st); err != nil {
			return err
		}
	}
	if st != nil {
		if name, dir, ok := catalogCopy(real); ok {
			return badInput("--out %s is the tokenizer %s of the data directory %s (its catalog's copy): a published name always means the same bytes, so it is refused even with --force; write to another path", out, name, dir)
		}
	}
	if _, own := descriptorOf(out); st != nil && !p.force && !own {
		return badInput("--out %s already exists: pass --force to replace it, or choose another path", out)
	}
	return nil
}

// descriptorOf returns the descriptor of this process that out names
// through /proc/self/fd or /dev/fd, its symbolic links followed:
// /dev/stdout (1), /dev/stderr, /dev/fd/3. What is behind it, a file the
// shell opened included, is written in place: nothing is renamed over.
func descriptorOf(out string) (uintptr, bool) {
	p := out
	for range 16 {
		clean := filepath.Clean(p)
		for _, dir := range []string{"/proc/self/fd/", "/dev/fd/", "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/"} {
			if rest, ok := strings.CutPrefix(clean, dir); ok {
				if n, err := strconv.ParseUint(rest, 10, 31); err == nil {
					return uintptr(n), true
				}
			}
		}
		link, err := os.Readlink(clean)
		if err != nil {
			return 0, false
		}
		if !filepath.IsAbs(link) {
			link = filepath.Join(filepath.Dir(clean), link)
		}
		p = link
	}
	return 0, false
}

// resolvePath is out made absolute with its symbolic links followed (those
// of its directory, when out does not exist yet), so that a path through a
// link is judged by where it leads.
func resolvePath(out string) string {
	abs, err := filepath.Abs(out)
	if err != nil {
		return filepath.Clean(out)
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r
	}
	if d, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(d, filepath.Base(abs))
	}
	return abs
}

// managedDirs are the directories whose files only kiln writes: a token
// store (a directory holding its manifest.json) and a training checkpoint
// (one holding its trainer_state.json, a damaged one included).
var managedDirs = []struct {
	what, writer, harm string
	is                 func(dir string) bool
}{
	{"token store", "ingest", "break the store", isTokenStore},
	{"checkpoint", "training", "damage the checkpoint", trainer.HoldsCheckpoint},
}

// holding returns the nearest directory above path that is one, if any.
func holding(path string, is func(dir string) bool) (string, bool) {
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		if is(dir) {
			return dir, true
		}
		if filepath.Dir(dir) == dir {
			return "", false
		}
	}
}

// isTokenStore reports whether dir is a token store: a directory holding
// a manifest.json, as the catalog's store scan finds them, whose format is
// kiln's (tokens.ReadManifest's first check). A manifest.json beside a
// tokens.bin is a store too: one whose manifest is damaged is still
// someone's data.
func isTokenStore(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, tokens.ManifestFile))
	if err != nil {
		return false
	}
	var m struct {
		Format string `json:"format"`
	}
	if json.Unmarshal(b, &m) == nil && m.Format == tokens.Format {
		return true
	}
	_, err = os.Stat(filepath.Join(dir, tokens.TokensFile))
	return err == nil
}

// storeFileLinkedAs finds the store under <data dir>/tokens that holds the
// file st is, by another name (a hard link).
func (p outPolicy) storeFileLinkedAs(st fs.FileInfo) (string, bool) {
	root := filepath.Join(p.cfg.DataDir, "tokens")
	dirs, _ := os.ReadDir(root) // no stores yet: nothing to find
	for _, d := range dirs {
		dir := filepath.Join(root, d.Name())
		if !d.IsDir() || !isTokenStore(dir) {
			continue
		}
		files, _ := os.ReadDir(dir)
		for _, f := range files {
			if fst, err := os.Stat(filepath.Join(dir, f.Name())); err == nil && os.SameFile(st, fst) {
				return dir, true
			}
		}
	}
	return "", false
}

// catalogCopy says whether path is a tokenizer.json where a data
// directory's catalog keeps one, <data dir>/tokenizers/NAME, or its local
// object store, <data dir>/objects/tokenizers/NAME, of any data directory:
// one a command's configuration does not name is published all the same,
// and stores and runs of its own use it. A data directory is known by its
// tokens or objects directory beside the tokenizers.
func catalogCopy(path string) (name, dataDir string, ok bool) {
	nameDir := filepath.Dir(path)
	tokenizers := filepath.Dir(nameDir)
	if filepath.Base(path) != catalog.FileName || filepath.Base(tokenizers) != "tokenizers" {
		return "", "", false
	}
	root := filepath.Dir(tokenizers)
	if filepath.Base(root) == "objects" {
		return filepath.Base(nameDir), filepath.Dir(root), true
	}
	for _, sub := range []string{"tokens", "objects"} {
		if st, err := os.Stat(filepath.Join(root, sub)); err == nil && st.IsDir() {
			return filepath.Base(nameDir), root, true
		}
	}
	return "", "", false
}

// catalogRoots are the directories whose NAME/tokenizer.json the catalog
// reads: the data directory's copies, and the local object store's, which
// is the published one where there is no S3.
func (p outPolicy) catalogRoots() []string {
	roots := []string{catalog.New(nil, p.cfg.DataDir).Dir}
	if p.cfg.S3Endpoint == "" {
		roots = append(roots, filepath.Join(p.cfg.LocalStoreDir(), filepath.FromSlash(strings.TrimSuffix(catalog.Prefix, "/"))))
	}
	return roots
}

// checkNotPublished refuses an --out that is the tokenizer.json of a
// published tokenizer (st is the existing file, nil for a new one at
// real): by its path in the catalog, or by a link to it. A new file where
// the catalog already knows the name (from object storage) is refused as
// well: the local copy would differ from the published one.
func (p outPolicy) checkNotPublished(ctx context.Context, out, real string, st fs.FileInfo) error {
	name := ""
roots:
	for _, root := range p.catalogRoots() {
		if filepath.Base(real) == catalog.FileName && filepath.Dir(filepath.Dir(real)) == resolvePath(root) {
			name = filepath.Base(filepath.Dir(real))
			break
		}
		if st == nil {
			continue
		}
		dirs, _ := os.ReadDir(root) // no catalog yet: nothing published here
		for _, d := range dirs {
			if fst, err := os.Stat(filepath.Join(root, d.Name(), catalog.FileName)); err == nil && os.SameFile(st, fst) {
				name = d.Name()
				break roots
			}
		}
	}
	if name == "" {
		return nil
	}
	// The object store only now, for a path that is the catalog's: every
	// other --out is judged without it.
	objects, err := openStore(ctx, p.cfg)
	if err != nil {
		return err
	}
	cat := catalog.New(objects, p.cfg.DataDir)
	if st == nil {
		names, err := cat.Names(ctx)
		if err != nil {
			return err
		}
		if !slices.Contains(names, name) {
			return nil // a new name: writing it here is how one is made
		}
	}
	users, err := tokenizerUsers(ctx, cat, filepath.Join(p.cfg.DataDir, "tokens"), name)
	if err != nil {
		return err
	}
	return badInput("--out %s is the published tokenizer %s%s: a published name always means the same bytes, so it is refused even with --force; write to another path (and publish a new tokenizer under a new name)", out, name, users)
}

// tokenizerUsers says which token stores and runs use the published
// tokenizer name, as "that token store S and run R use", or
// " (no token store or run uses it yet)".
func tokenizerUsers(ctx context.Context, cat *catalog.Catalog, tokensDir, name string) (string, error) {
	// The catalog's description, which copies nothing to this machine:
	// the published bytes' hash is the one stores and runs record.
	entries, err := cat.List(ctx)
	if err != nil {
		return "", err
	}
	sum := ""
	for _, e := range entries {
		if e.Name == name {
			sum = e.SHA256
		}
	}
	u, err := cat.Usage(ctx, tokensDir)
	if err != nil {
		return "", err
	}
	var parts []string
	for _, g := range []struct {
		one   string
		names []string
	}{{"token store", u.Stores[sum]}, {"run", u.Runs[sum]}} {
		switch len(g.names) {
		case 0:
		case 1:
			parts = append(parts, g.one+" "+g.names[0])
		default:
			parts = append(parts, g.one+"s "+strings.Join(g.names, ", "))
		}
	}
	if len(parts) == 0 {
		return " (no token store or run uses it yet)", nil
	}
	return " that " + strings.Join(parts, " and ") + " use", nil
}
