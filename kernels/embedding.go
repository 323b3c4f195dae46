package kernels

// embedItemRows bounds the sorted positions one block of embed_bwd_items
// sums: a token more frequent than that (a space, a newline) is split over
// several blocks whose sums embed_bwd_sum adds up, so that no block walks
// hundreds of rows alone.
const embedItemRows = 32

// embedPlanInts is the size of the embedding backward's plan for n
// positions (embedding.cu): the header, the sorted positions, at most n
// items and at most n / (embedItemRows + 1) long tokens.
func embedPlanInts(n int) int { return 3 + n + 4*n + 3*embedLongMax(n) }

// embedLongMax is the most tokens of n positions that can occur more than
// embedItemRows times.
func embedLongMax(n int) int { return n/(embedItemRows+1) + 1 }

// embedPartRows is the most rows of partial sums a plan for n positions
// uses: a long token of c positions takes ceil(c / embedItemRows) < 2c /
// embedItemRows of them.
func embedPartRows(n int) int { return 2*n/embedItemRows + 1 }

// embedPlan writes into plan (embedPlanInts(len(ids)) values) the order
// in which embed_bwd_items and embed_bwd_sum add the rows of ids' gradient
// into the embedding's, and returns how many values it used. count is
// scratch of one value per token of the vocabulary. The positions are
// sorted by a counting sort, stable, so each token's rows are added in
// position order.
func embedPlan(ids []int32, count []int32, plan []int32) int {
	n := len(ids)
	clear(count)
	for _, id := range ids {
		count[id]++
	}
	// count becomes each token's first place in the sorted order.
	at := int32(0)
	for v, c := range count {
		count[v] = at
		at += c
	}
	order := plan[3 : 3+n]
	for p, id := range ids {
		order[count[id]] = int32(p)
		count[id]++
	}
	items := plan[3+n : 3+n]
	var long []int32
	slot := int32(0)
	for s := 0; s < n; {
		id := ids[order[s]]
		e := s + 1
		for e < n && ids[order[e]] == id {
			e++
		}
		if e-s <= embedItemRows {
			items = append(items, int32(s), int32(e-s), id, -1)
		} else {
			first := slot
			for k := s; k < e; k += embedItemRows {
				items = append(items, int32(k), int32(min(embedItemRows, e-k)), id, slot)
				slot++
			}
			long = append(long, id, first, slot-first)
		}
		s = e
	}
	P := len(items) / 4
	off := 3 + n + len(items)
	copy(plan[off:], long)
	plan[0], plan[1], plan[2] = int32(P), int32(len(long)/3), int32(off)
	return off + len(long)
}
