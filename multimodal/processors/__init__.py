"""Model families: one file each (qwen_vl, llava, llava_next), on one interface (base) and the
shared steps (transforms: single image operations; pixels: the CLIP-style resize, crop and
normalize chain), with typed per-request options (options). `multimodal.registry` picks the
family for a model."""
