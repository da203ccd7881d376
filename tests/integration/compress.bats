#!/usr/bin/env bats
# [comm] compress = fp16 | bf16: gradients travel in half precision. The effect on the example
# trainer is pinned: one step stays within the half type's precision of the exact update, ranks
# stay identical, and one epoch's test accuracy stays within a point of the uncompressed run.
load helpers

setup_file() {
    export REF=$BATS_FILE_TMPDIR
    "$TRAINER" --steps 1 --no-eval --seed 7 --save "$REF/one.ckpt" >/dev/null
    mkdir -p "$REF/none"
    train_np 2 "$REF/none" --steps 1 --no-eval --seed 7 >/dev/null
}

one_step() {
    local c=$1 bound=$2 dir=$BATS_TEST_TMPDIR/$1
    mkdir -p "$dir"
    DPSHIM_COMM_COMPRESS=$c run train_np 2 "$dir" --steps 1 --no-eval --seed 7
    assert_success
    rel=$(rel_diff "$REF/one.ckpt" "$dir/rank0.ckpt")
    echo "$c: one step rel $rel" >&3
    assert_le "$rel" "$bound"
    # it really was compressed: not the uncompressed job's result
    assert_le 1e-7 "$(rel_diff "$REF/none/rank0.ckpt" "$dir/rank0.ckpt")"
    run "$CKPT" same "$dir/rank0.ckpt" "$dir/rank1.ckpt"
    assert_success
}

@test "fp16: one step within 1e-5 of the exact update, ranks identical" { one_step fp16 1e-5; }
@test "bf16: one step within 1e-4 of the exact update, ranks identical" { one_step bf16 1e-4; }

accuracy() {
    run mpi 2 env DPSHIM_OUTPUT_STDOUT=rank0 DPSHIM_COMM_COMPRESS="$1" LD_PRELOAD="$SHIM" "$TRAINER" --epochs 1
    assert_success
    sed -n 's/^final test accuracy \([0-9.]*\)%.*/\1/p' <<<"$output"
}

@test "one epoch at np=2: test accuracy with fp16 and bf16 within a point of uncompressed" {
    none=$(accuracy none)
    for c in fp16 bf16; do
        acc=$(accuracy $c)
        echo "accuracy: none $none%, $c $acc%" >&3
        assert_le "$(awk -v a="$none" -v b="$acc" 'BEGIN { d = a - b; print d < 0 ? -d : d }')" 1
    done
}
