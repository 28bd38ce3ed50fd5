# (the project's venv active)
cd "$(dirname "$0")/../../.."
n=${1:-5}
for i in $(seq $n); do
  for s in 07_vector_play 08_graph_learner; do
    [ $((i % 2)) = 0 ] && s=$([ $s = 07_vector_play ] && echo 08_graph_learner || echo 07_vector_play)
    r=$(python $s.py --device cpu --max-frames 3400 --replay-initial 1000 --quiet --run-dir /tmp/abruns 2>&1 | grep ^RESULT)
    echo "$i $r"
  done
done
