#include "textflag.h"

// STOREROW adds a tile row (lo: columns 0-7, hi: 8-15) into C's row at DX.
#define STOREROW(lo, hi) \
	VADDPS  (DX), lo, lo \
	VADDPS  32(DX), hi, hi \
	VMOVUPS lo, (DX) \
	VMOVUPS hi, 32(DX)

// func kernelAVX2(k int, a *float32, rs, ps int, b, c *float32, ldc int)
//
// C[0:6, 0:16] (row stride ldc floats) += A·B over k steps. Element (r, p)
// of A is at a + r*rs + p*ps floats: a packed panel (rs 1, ps 6) or rows
// of the operand as stored, either way round. B is packed as k groups of
// 16. Y0-Y11 hold the tile, two registers a row; Y12-Y13 one step of B;
// Y14-Y15 a broadcast A value. SI and R11 point at A's rows 0 and 3 of
// the step; R9 is rs in bytes.
TEXT ·kernelAVX2(SB), NOSPLIT, $0-56
	MOVQ k+0(FP), CX
	MOVQ a+8(FP), SI
	MOVQ rs+16(FP), R9
	MOVQ ps+24(FP), R10
	MOVQ b+32(FP), DI
	MOVQ c+40(FP), DX
	MOVQ ldc+48(FP), R8
	SHLQ $2, R8
	SHLQ $2, R9
	SHLQ $2, R10
	LEAQ (SI)(R9*2), R11
	ADDQ R9, R11

	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11

	TESTQ CX, CX
	JEQ   store

loop:
	VMOVUPS      (DI), Y12
	VMOVUPS      32(DI), Y13
	VBROADCASTSS (SI), Y14
	VBROADCASTSS (SI)(R9*1), Y15
	VFMADD231PS  Y12, Y14, Y0
	VFMADD231PS  Y13, Y14, Y1
	VFMADD231PS  Y12, Y15, Y2
	VFMADD231PS  Y13, Y15, Y3
	VBROADCASTSS (SI)(R9*2), Y14
	VBROADCASTSS (R11), Y15
	VFMADD231PS  Y12, Y14, Y4
	VFMADD231PS  Y13, Y14, Y5
	VFMADD231PS  Y12, Y15, Y6
	VFMADD231PS  Y13, Y15, Y7
	VBROADCASTSS (R11)(R9*1), Y14
	VBROADCASTSS (R11)(R9*2), Y15
	VFMADD231PS  Y12, Y14, Y8
	VFMADD231PS  Y13, Y14, Y9
	VFMADD231PS  Y12, Y15, Y10
	VFMADD231PS  Y13, Y15, Y11
	ADDQ         R10, SI
	ADDQ         R10, R11
	ADDQ         $64, DI
	DECQ         CX
	JNE          loop

store:
	STOREROW(Y0, Y1)
	ADDQ R8, DX
	STOREROW(Y2, Y3)
	ADDQ R8, DX
	STOREROW(Y4, Y5)
	ADDQ R8, DX
	STOREROW(Y6, Y7)
	ADDQ R8, DX
	STOREROW(Y8, Y9)
	ADDQ R8, DX
	STOREROW(Y10, Y11)
	VZEROUPPER
	RET
