package tokens

import "math/bits"

// feistelRounds: four rounds already make a balanced Feistel network a
// pseudo-random permutation; six leave a margin for the weak round function.
const feistelRounds = 6

// permutation is a seeded bijection on [0, n) that stores no table: a
// balanced Feistel network on the smallest even number of bits that covers
// n, with cycle walking (re-applying the network until the value lands
// below n). The domain is less than 4n, so a lookup takes fewer than four
// network evaluations on average.
type permutation struct {
	n    uint64
	half uint // bits per Feistel half
	mask uint64
	keys [feistelRounds]uint64
}

func newPermutation(n, seed uint64) permutation {
	p := permutation{n: n, half: 1}
	if n > 1 {
		p.half = uint(bits.Len64(n-1)+1) / 2
	}
	p.mask = 1<<p.half - 1
	k := seed
	for r := range p.keys {
		k = mix64(k + 0x9e3779b97f4a7c15)
		p.keys[r] = k
	}
	return p
}

// at returns the i-th element of the permutation, for i < n.
func (p *permutation) at(i uint64) uint64 {
	x := i
	for {
		x = p.feistel(x)
		// x walks the cycle of the network through i, which returns to i;
		// the first value below n on it is i's image, so this ends.
		if x < p.n {
			return x
		}
	}
}

func (p *permutation) feistel(x uint64) uint64 {
	l, r := x>>p.half, x&p.mask
	for _, k := range p.keys {
		l, r = r, l^(mix64(r^k)&p.mask)
	}
	return l<<p.half | r
}

// mix64 is SplitMix64's finaliser: every input bit flips each output bit
// with probability close to 1/2.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
