// The oracle of tests/test_note_json.py: Go's encoding/json filling the struct that
// NVIDIA/nvidia-container-toolkit's cmd/nvidia-cdi-hook/cudacompat/cuda-elf-header.go
// (compatElfHeader, GetCUDACompatElfHeaderFromReader) decodes a compat note into.
// Each line of stdin is one note description in base64; each line of stdout is what
// json.Unmarshal made of it, as JSON ({"err": true} where it returned an error).
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
)

type cudaVersion string

type compatElfHeader struct {
	Format      int
	CUDAVersion cudaVersion `json:"CUDA Version"`
	Driver      []int
	Device      []int
}

type result struct {
	Err    bool   `json:"err"`
	Format int    `json:"format"`
	CUDA   string `json:"cuda"`
	Driver []int  `json:"driver"`
	Device []int  `json:"device"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		raw, err := base64.StdEncoding.DecodeString(in.Text())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		h := &compatElfHeader{}
		if err := json.Unmarshal(raw, h); err != nil {
			_ = out.Encode(result{Err: true})
			continue
		}
		_ = out.Encode(result{Format: h.Format, CUDA: string(h.CUDAVersion), Driver: h.Driver, Device: h.Device})
	}
}
