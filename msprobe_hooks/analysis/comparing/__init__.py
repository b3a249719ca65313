"""Stage 2, comparing: each pair's dumps read and compared tensor by tensor across the engines' names (the name
map, the fused parts' statistics, TP shards made whole, the routers' choices), in a pool or on Ray. Errors only:
what they mean is the answer's. Imports pairing only."""
