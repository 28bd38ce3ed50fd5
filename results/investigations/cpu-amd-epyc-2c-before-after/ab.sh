. /work/main/.venv/bin/activate
for i in 1 2 3; do
  for side in old new; do
    dir=/tmp/oldsrc; [ $side = new ] && dir=/work/main
    for s in 07_vector_play 02_play_steps; do
      r=$(cd $dir && python $s.py --device cpu --max-frames 3000 --replay-initial 1000 --quiet --run-dir /tmp/abruns 2>&1 | grep ^RESULT)
      echo "$i $side $s $r"
    done
  done
done
