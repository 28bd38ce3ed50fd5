# Stage runs with glibc's malloc as it comes (DQN_MALLOC_DEFAULTS=1) and as the stages set it,
# interleaved: per round, each stage with "glibc" then "kept" (the order flips every round).
# Prints one line per run: round, setting, RESULT line, minor page faults of the trainer.
# Usage (the project's venv active): bash results/investigations/cpu-amd-epyc-2c-malloc/ab.sh [ROUNDS] [STAGES...]
rounds=${1:-3}; shift
stages=${*:-05_new_wrapper 07_vector_play 08_graph_learner}
for i in $(seq "$rounds"); do
  for s in $stages; do
    order="glibc kept"; [ $((i % 2)) = 0 ] && order="kept glibc"
    for side in $order; do
      flag=0; [ $side = glibc ] && flag=1
      out=$(DQN_MALLOC_DEFAULTS=$flag /usr/bin/time -f "minflt %R" python "$s.py" --device cpu --max-frames 3400 \
        --replay-initial 1000 --quiet --run-dir /tmp/malloc-ab 2>&1)
      echo "$i $side $(grep ^RESULT <<<"$out") $(grep ^minflt <<<"$out")"
    done
  done
done
