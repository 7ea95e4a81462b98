set terminal pngcairo size 1000,800 font ',9' noenhanced
set output "sweep_out/sweep.png"
set multiplot layout 2,1 title "recipes/llama2_7b.lua --num_layers=1 --hidden_width=32 --num_heads=4 --vocab_size=64 --seq_len=16"
set style fill solid 0.6 border -1
set boxwidth 0.6
set grid ytics
set xtics rotate by 20 right
set yrange [0:*]
set xrange [0.3:8.700000]
set ylabel "samples/s"
plot "sweep_out/sweep.dat" using 1:3:xtic(2) with boxes notitle, "" using 1:(0):5 with labels offset 0,1 textcolor rgb "red" notitle
set xlabel "dtype / activation_checkpointing / batch_size"
set ylabel "peak memory (MiB)"
set yrange [0:23]
set arrow from graph 0, first 20 to graph 1, first 20 nohead dashtype 2 lc rgb "red"
set label "limit 20 MiB" at graph 0.01, first 20 offset 0,0.6 textcolor rgb "red"
plot "sweep_out/sweep.dat" using 1:4:xtic(2) with boxes lc rgb "#c06000" notitle, "" using 1:(0):5 with labels offset 0,1 textcolor rgb "red" notitle
unset multiplot
